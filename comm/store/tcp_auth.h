#pragma once
// Note [Store authentication]
// The TCP store's clients prove that they know the shared secret without sending it: on
// every new connection the server sends a fresh 32-byte random nonce (kChallenge), and the
// client answers with HMAC-SHA256(secret, nonce) in its hello. The server compares that
// with its own HMAC in constant time and drops the connection, without a reply, when they
// differ. A hello captured on the wire proves nothing on another connection (another
// nonce), and the secret itself never crosses the network. OpenSSL's libcrypto computes the
// HMAC and draws the nonces.

#include <string>
#include <string_view>

namespace loom::comm::tcp {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // SHA-256

// kNonceBytes fresh random bytes (throws loom::CommError when none can be drawn).
std::string new_nonce();
// HMAC-SHA256 of `nonce` keyed with `secret`: what a client sends to prove the secret.
std::string hello_proof(std::string_view secret, std::string_view nonce);
// Equality in time that depends on the lengths only.
bool proofs_equal(std::string_view expected, std::string_view given);

}  // namespace loom::comm::tcp
