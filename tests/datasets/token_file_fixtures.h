#pragma once
// Token files written without data/token_shards.h, byte for byte as their owners write them,
// so that Loom's writer and reader are checked against the formats and not against each
// other.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"

namespace loom::testing {

// llm.c's dev/data/data_common.py, write_datafile(filename, toks, model_desc), restated:
//   header = np.zeros(256, dtype=np.int32)
//   header[0] = magic; header[1] = version; header[2] = len(toks)
//   toks_np = np.array(toks, dtype=token_dtype)        # uint16 (gpt-2) or uint32 (llama-3)
//   f.write(header.tobytes()); f.write(toks_np.tobytes())
// `count` goes into header[2] as given, so that a test can make it disagree with the tokens.
template <typename Token>
void write_like_llmc(const std::filesystem::path& path, int32_t magic, int32_t version,
                     int32_t count, const std::vector<Token>& tokens) {
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) throw Error("cannot create " + path.string());
  bool ok = std::fwrite(header, sizeof(int32_t), 256, file) == 256;
  if (!tokens.empty())  // fwrite's pointer may not be null, even for no items
    ok = ok && std::fwrite(tokens.data(), sizeof(Token), tokens.size(), file) == tokens.size();
  ok = std::fclose(file) == 0 && ok;
  if (!ok) throw Error("cannot write " + path.string());
}

// The file as it is: nanoGPT's prepare.py writes np.array(ids, dtype=np.uint16).tofile(f).
inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw Error("cannot write " + path.string());
}

template <typename Token>
void write_raw_tokens(const std::filesystem::path& path, const std::vector<Token>& tokens) {
  write_bytes(path, std::string(reinterpret_cast<const char*>(tokens.data()),
                                tokens.size() * sizeof(Token)));
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace loom::testing
