#include "comm/store/tcp_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "comm/error.h"
#include "tensor/error.h"

namespace loom::comm::tcp {

std::string new_nonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    throw CommError("[comm/store] cannot draw random bytes for an authentication challenge");
  }
  return nonce;
}

std::string hello_proof(std::string_view secret, std::string_view nonce) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(nonce.data()), nonce.size(), mac,
           &length) == nullptr ||
      length != kProofBytes) {
    fail("[comm/store] HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<const char*>(mac), length);
}

bool proofs_equal(std::string_view expected, std::string_view given) {
  return expected.size() == given.size() &&
         CRYPTO_memcmp(expected.data(), given.data(), expected.size()) == 0;
}

}  // namespace loom::comm::tcp
