#include "comm/store/tcp_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "comm/error.h"
#include "core/error.h"
#include "core/tags.h"

namespace loom::comm::tcp {

namespace {

// OpenSSL is set up on first use without its exit-time cleanup (OPENSSL_INIT_NO_ATEXIT).
// The store server's thread belongs to a static and is stopped by that static's destructor,
// which can run after OpenSSL's atexit handler; OPENSSL_cleanup before the thread ends
// orphans the thread's OpenSSL state (LeakSanitizer reported it for a rank that served the
// store under srun). Without it, the global state stays referenced until the process ends,
// and each thread's state is freed when the thread exits.
void use_openssl() {
  static const bool ready = OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;
  if (!ready) tag::kCommStore.fail("OpenSSL (libcrypto) failed to initialize");
}

}  // namespace

std::string new_nonce() {
  use_openssl();
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    throw CommError(tag::kCommStore.prefix() +
                    "cannot draw random bytes for an authentication challenge");
  }
  return nonce;
}

std::string hello_proof(std::string_view secret, std::string_view nonce) {
  use_openssl();
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(nonce.data()), nonce.size(), mac,
           &length) == nullptr ||
      length != kProofBytes) {
    tag::kCommStore.fail("HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<const char*>(mac), length);
}

bool proofs_equal(std::string_view expected, std::string_view given) {
  return expected.size() == given.size() &&
         CRYPTO_memcmp(expected.data(), given.data(), expected.size()) == 0;
}

}  // namespace loom::comm::tcp
