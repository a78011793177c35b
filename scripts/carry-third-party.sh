#!/usr/bin/env bash
# Copies the third-party pieces that the GPU machine lacks into ./third_party_carry/, for
# scripts/gpu-check.sh. Run on the development machine (Debian 12 with the packages of
# scripts/install-deps.sh, plus libhwloc-dev), from anywhere; the folder is made at the
# repository root and replaced if it exists.
#
# The GPU machine (the device tool's H100/H200 image) has nvcc, CMake, ninja and PyTorch but
# no Debian packages and no network, so it lacks what Loom's CMake asks for:
#   find_package(Eigen3 / dnnl / OpenSSL / nlohmann_json / CLI11)   top-level CMakeLists.txt
#   (OpenSSL: the headers and the libcrypto.so link are carried; libcrypto.so.3 itself is
#   assumed present, as on any image with Python)
#   find_package(GTest)                            tests/CMakeLists.txt
#   find_package(benchmark)                        bench/CMakeLists.txt
#   pkg_check_modules(hwloc)                       tools/loomrun/CMakeLists.txt (pkg-config too)
# (fmt is not used by Loom.)
#
# Layout (about 55 MiB, 38 of them libdnnl.so; the device tool carries at most 64 MiB with the
# working tree):
#   third_party_carry/usr/...           the packages' files at their Debian paths under /usr:
#                                       headers, CMake config files, pkg-config files (rewritten
#                                       to be relocatable), libbenchmark.so (Debian ships no
#                                       static libbenchmark.a) and libhwloc.so. The CMake config
#                                       files compute their prefix from their own location, so
#                                       they work from any folder.
#   third_party_carry/googletest-src/   /usr/src/googletest (GoogleTest + GoogleMock sources;
#                                       gpu-check.sh builds and installs them into
#                                       /tmp/loom-gtest-install with the GPU machine's
#                                       compiler)
#   third_party_carry/fallback/         pkgconf (bin/pkg-config, a wrapper) and libudev.so.1
#                                       (which libhwloc.so needs), used only where the GPU
#                                       machine has none of its own
#   third_party_carry/MANIFEST.txt      package versions and what was copied
#
# Usage:  bash scripts/carry-third-party.sh
# Then name third_party_carry in the device tool's `carry` (it must be ignored by git, or it
# travels anyway as an untracked file) and run scripts/gpu-check.sh there.

set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRY="$ROOT/third_party_carry"
ARCH=x86_64-linux-gnu
LIMIT_MIB=64

die() { echo "carry-third-party: $*" >&2; exit 1; }

command -v dpkg >/dev/null || die "dpkg not found: this script reads Debian's package lists"
[ "$(uname -m)" = x86_64 ] || die "this machine is $(uname -m); the GPU machine is x86-64, carry from an x86-64 machine"

# Debian packages whose files are copied (docs, man pages and static libraries skipped).
PACKAGES=(libeigen3-dev nlohmann-json3-dev libcli11-dev libbenchmark-dev libbenchmark1debian
          libdnnl-dev libdnnl2 libssl-dev
          libhwloc-dev libhwloc15 googletest)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  die "not installed: ${missing[*]} (apt-get install ${missing[*]})"
fi

rm -rf "$CARRY"
mkdir -p "$CARRY/usr" "$CARRY/fallback/bin" "$CARRY/fallback/lib" || die "cannot create $CARRY"

copy_path() {  # copy_path /usr/...  -> $CARRY/usr/... (symbolic links kept as links; not cp -a, which fails on some
  # overlay file systems when it preserves ownership)
  local src=$1
  mkdir -p "$CARRY$(dirname "$src")" &&
    cp -P --preserve=mode,timestamps "$src" "$CARRY$src" || die "cannot copy $src"
}

{
  echo "# third_party_carry, made by scripts/carry-third-party.sh on $(hostname) at $(date -Is)"
  echo "# $(. /etc/os-release && echo "$PRETTY_NAME"), $(uname -m)"
  echo
  echo "## packages"
} >"$CARRY/MANIFEST.txt"

for p in "${PACKAGES[@]}"; do
  version=$(dpkg-query -W -f='${Version}' "$p")
  echo "$p $version" >>"$CARRY/MANIFEST.txt"
  [ "$p" = googletest ] && continue  # copied as a source tree below
  while IFS= read -r f; do
    case "$f" in
      /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/* | /usr/share/aclocal/*) continue ;;
      *.a) [ "$(basename "$f")" = libbenchmark_main.a ] || continue ;;  # the only static lib we need
    esac
    # Files and links only; their folders are made by --parents.
    if [ -L "$f" ] || [ -f "$f" ]; then copy_path "$f"; fi
  done < <(dpkg -L "$p")
done

# hwloc.h includes <hwloc/autogen/config.h>, which Debian puts in the multiarch include folder
# (/usr/include/x86_64-linux-gnu) that only the system compiler searches; put a copy beside the
# other hwloc headers so that -I<prefix>/include finds it.
if [ -d "$CARRY/usr/include/$ARCH/hwloc/autogen" ]; then
  mkdir -p "$CARRY/usr/include/hwloc/autogen"
  cp -rP --preserve=mode,timestamps "$CARRY/usr/include/$ARCH/hwloc/autogen/." "$CARRY/usr/include/hwloc/autogen/"
fi

# pkg-config files: every /usr (prefix=, libdir=, -I/usr/include) -> a path relative to the
# .pc file, so they work from any folder.
while IFS= read -r pc; do
  rel=${pc#"$CARRY/usr/"}                    # e.g. lib/x86_64-linux-gnu/pkgconfig/hwloc.pc
  depth=$(($(tr -cd / <<<"$rel" | wc -c)))   # folders between usr/ and the file
  up=$(printf '/..%.0s' $(seq "$depth"))
  to='${pcfiledir}'"$up"                     # pkg-config expands ${pcfiledir} itself
  sed -i -E "s#(^|[=[:space:]]|-I|-L)/usr(/|\$|[[:space:]])#\1$to\2#g" "$pc" ||
    die "cannot rewrite $pc"
  ! grep -q '/usr' "$pc" || die "$pc: /usr left after the rewrite: $(grep /usr "$pc")"
done < <(find "$CARRY/usr" -name '*.pc')

# The CMake package files must compute their prefix from their own location (no /usr inside,
# except the benchmark/GTest symlink check that compares against the original path).
bad=$(grep -rln '"/usr' "$CARRY/usr" --include='*.cmake' |
      xargs -r grep -Ln '_realOrig\|PACKAGE_PREFIX_DIR "/usr"' || true)
[ -z "$bad" ] || die "CMake files with absolute /usr paths: $bad"

# GoogleTest + GoogleMock sources.
cp -rP --preserve=mode,timestamps /usr/src/googletest "$CARRY/googletest-src" || die "cannot copy /usr/src/googletest"

# Fallbacks, used by gpu-check.sh only where the GPU machine lacks them.
cp -P --preserve=mode,timestamps /usr/bin/pkgconf "$CARRY/fallback/bin/pkgconf" || die "cannot copy pkgconf"
cp -P --preserve=mode,timestamps /usr/lib/$ARCH/libpkgconf.so.3* "$CARRY/fallback/lib/" || die "cannot copy libpkgconf"
cp -P --preserve=mode,timestamps /usr/lib/$ARCH/libudev.so.1* "$CARRY/fallback/lib/" || die "cannot copy libudev"
cat >"$CARRY/fallback/bin/pkg-config" <<'EOF'
#!/bin/sh
# pkgconf carried from Debian 12, with its library beside it.
here=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/pkgconf" "$@"
EOF
chmod +x "$CARRY/fallback/bin/pkg-config"

{
  echo
  echo "## CMake package folders (pass as <Package>_DIR or put usr/ in CMAKE_PREFIX_PATH)"
  find "$CARRY/usr" -name '*Config.cmake' -printf '%P\n' | sed 's|^|usr/|' | sort
  echo
  echo "## libraries"
  (cd "$CARRY" && find usr/lib fallback -name '*.so*' -printf '%p\t%l\n' |
     awk -F'\t' '{ print $1 ($2 != "" ? " -> " $2 : "") }' | sort)
  echo
  echo "## size"
  du -sh "$CARRY" | cut -f1
} >>"$CARRY/MANIFEST.txt"

mib=$(du -sm "$CARRY" | cut -f1)
[ "$mib" -lt "$LIMIT_MIB" ] || die "third_party_carry is ${mib} MiB, over the device tool's ${LIMIT_MIB} MiB"

if git -C "$ROOT" check-ignore -q third_party_carry/MANIFEST.txt; then
  ignored="ignored by git: name it in the device tool's carry"
else
  ignored="NOT ignored by git: add /third_party_carry/ to .gitignore (or .git/info/exclude), or it travels as untracked files and shows in git status"
fi
echo "carry-third-party: wrote $CARRY (${mib} MiB); $ignored"
