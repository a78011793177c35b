#!/usr/bin/env bash
# The installed package (docs/api.md): cmake --install into a temporary prefix. Its headers
# are the public ones (cmake/public_headers.txt) and what they include, no CUDA or NCCL header
# in a build without them, each compiling on its own with loom.pc's flags and all together
# with the CMake package's, and none including another project's header that the package
# does not provide. pkg-config reads loom.pc there; examples/consumer, a separate CMake project
# that knows nothing but the prefix, is configured, built, and run on 2 ranks under the
# installed loomrun with a built-in and with a user-registered strategy. Then the same against
# the Debian packages' files (cpack -G DEB: loom, the tools, and loom-dev; unpacked with
# dpkg-deb -x), and the packages installed and removed by dpkg itself in a scratch root with a
# database of its own: the machine's packages are not touched.
# A sanitized build skips the .deb half (the release build checks it).
#   consumer.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
B=$1; S=$2
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
cache() { sed -n "s/^$1:[A-Z]*=//p" "$B/CMakeCache.txt"; }
on() { case "$(cache "$1" | tr '[:lower:]' '[:upper:]')" in ON|1|TRUE|YES|Y) true ;; *) false ;; esac; }
cmake --install "$B" --prefix "$d/prefix" > "$d/install.log"
test -f "$d/prefix/include/loom/strategies/fabric.h"
test -f "$d/prefix/lib/cmake/Loom/LoomConfigVersion.cmake"
test -x "$d/prefix/bin/train_gpt"
PKG_CONFIG_PATH="$d/prefix/lib/pkgconfig" pkg-config --cflags --libs loom > "$d/pc.txt"
grep -q -- "-I$d/prefix/lib/pkgconfig/../../include/loom" "$d/pc.txt" || { cat "$d/pc.txt"; exit 1; }
# GNU's OpenMP runtime is found by the package, not named by the build machine's path.
gomp=$(cache LOOM_GOMP_LIBRARY)
if grep -rlF "$gomp" "$d/prefix/lib/cmake" "$d/prefix/lib/pkgconfig"; then
  echo "the files above name the build machine's $gomp"; exit 1
fi

# The headers: exactly the closure CMake computed ($B/loom_installed_headers.txt), every public
# header among them, CUDA's and NCCL's only in a build with them.
inc="$d/prefix/include/loom"
(cd "$inc" && find . -type f | sed 's|^\./||' | LC_ALL=C sort) > "$d/headers.txt"
LC_ALL=C sort "$B/loom_installed_headers.txt" | diff -u - "$d/headers.txt" > "$d/headers.diff" ||
  { echo "the installed headers are not $B/loom_installed_headers.txt:"; cat "$d/headers.diff"; exit 1; }
while read -r header option; do
  case "$header" in '' | \#*) continue ;; esac
  if [ -n "$option" ] && ! on "$option"; then continue; fi
  test -f "$inc/$header" || { echo "the public header $header is not installed"; exit 1; }
done < "$S/cmake/public_headers.txt"
if ! on LOOM_WITH_CUDA && grep -E '(^|/)(cuda|nccl)/' "$d/headers.txt"; then
  echo "a build without CUDA installs the CUDA headers above"; exit 1
fi
# Other projects' headers: only the C++ and C standard libraries' and POSIX's, and in a CUDA
# build the CUDA runtime's (LoomConfig.cmake's find_dependency(CUDAToolkit), -I in loom.pc).
# Any other would need a find_dependency, a loom.pc Requires and a loom-dev Depends first.
allowed='^([a-z_]+|sys/[a-z_]+\.h|(unistd|fcntl|netdb|poll|pthread|signal|sched|errno|stdint|stddef)\.h)$'
on LOOM_WITH_CUDA && allowed="$allowed|^cuda_runtime_api\.h\$"
(cd "$inc" && { grep -rH -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*<' . || true; }) |
  sed -E 's|^\./([^:]*):.*<([^>]*)>.*|\1 \2|' > "$d/external.txt"
while read -r header external; do
  [[ "$external" =~ $allowed ]] || { echo "$header includes <$external>, which the package does not provide"; exit 1; }
done < "$d/external.txt"
# The consumer is compiled by the compiler the package was, as a user of that build would.
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$B/CMakeCache.txt")
# Each header compiles on its own, with loom.pc's flags alone (one translation unit each, on
# 2 cores; the first that fails stops the rest). The inner shell splits $LOOM_PC_CFLAGS. A
# sanitized build installs the same headers with the same flags (a sanitizer is a link
# option), so CI checks them once, in the release build's run of this test.
sanitized=$(cache LOOM_SANITIZE)  # empty for a build without a sanitizer
if [[ "$sanitized" =~ ^(OFF|off|FALSE|NO|0)$ ]]; then sanitized=; fi
if [ -z "$sanitized" ]; then
  # shellcheck disable=SC2016  # expanded by the inner shell
  LOOM_PC_CFLAGS=$(PKG_CONFIG_PATH="$d/prefix/lib/pkgconfig" pkg-config --cflags loom) LOOM_LOGS=$d \
    xargs -P 2 -n 1 bash -c '
      printf "#include \"%s\"\n" "$1" | "$0" $LOOM_PC_CFLAGS -fsyntax-only -x c++ - > "$LOOM_LOGS/header.$$.log" 2>&1 ||
        { echo "the installed $1 does not compile on its own:"; cat "$LOOM_LOGS/header.$$.log"; exit 255; }' \
    "$cxx" < "$d/headers.txt"
  echo "$(wc -l < "$d/headers.txt") installed headers compile one by one"
else
  echo "a $sanitized-sanitized build: the headers' one-by-one compile is the release build's"
fi

# pkg-config's flags alone build it (docs/api.md's command): Loom's libraries are static, so
# the flags must name every library they need.
# shellcheck disable=SC2046  # the flags are words
"$cxx" -O1 "$S/examples/consumer/trainer.cpp" -o "$d/consumer-pc" \
  $(PKG_CONFIG_PATH="$d/prefix/lib/pkgconfig" pkg-config --cflags --libs loom) > "$d/pc-build.log" 2>&1 || { cat "$d/pc-build.log"; exit 1; }
"$d/consumer-pc" > "$d/pc.log" 2>&1 || { cat "$d/pc.log"; exit 1; }
grep -q "consumer rank 0 of 1 (single_device)" "$d/pc.log" || { cat "$d/pc.log"; exit 1; }
cmake -S "$S/examples/consumer" -B "$d/consumer" -DCMAKE_PREFIX_PATH="$d/prefix" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release > "$d/configure.log" 2>&1 || { cat "$d/configure.log"; exit 1; }
cmake --build "$d/consumer" > "$d/build.log" 2>&1 || { cat "$d/build.log"; exit 1; }
# Every header, in one translation unit, with the flags the CMake package gives Loom::loom's
# users (the consumer's compile command, its source replaced).
python3 - "$d/consumer/compile_commands.json" > "$d/cmake-flags" << 'EOF'
import json, shlex, sys
words, out = shlex.split(json.load(open(sys.argv[1]))[0]["command"])[1:], []
while words:
    word = words.pop(0)
    if word in ("-o", "-c", "-MT", "-MF"):
        words.pop(0)
    elif word not in ("-MD", "-MMD"):
        out.append(word)
sys.stdout.write("\0".join(out))
EOF
mapfile -d '' cmake_flags < "$d/cmake-flags"
sed 's/.*/#include "&"/' "$d/headers.txt" |
  "$cxx" "${cmake_flags[@]}" -fsyntax-only -x c++ - > "$d/headers-cmake.log" 2>&1 ||
  { echo "the installed headers do not compile with the CMake package's flags:"; cat "$d/headers-cmake.log"; exit 1; }
run() {  # strategy: 2 ranks under the installed launcher
  "$d/prefix/bin/loomrun" --nproc-per-node 2 --master-port 0 "$d/consumer/consumer" \
    --strategy "$1" > "$d/$1.log" 2>&1 || { cat "$d/$1.log"; exit 1; }
}
run ddp
grep -q "consumer rank 1 of 2 (ddp)" "$d/ddp.log"
run my_ddp
grep -q "consumer rank 0 of 2 (my_ddp).*30 counted backward passes" "$d/my_ddp.log"
cat "$d/my_ddp.log"

# The .deb files: loom (the tools only) and loom-dev (everything else); unpacked, they serve the
# consumer the same way. Packaging does not depend on the build's flags, and nobody ships a
# sanitized build's packages: CI checks them once, in the release build's run of this test.
check_debs() {
  (cd "$B" && cpack -G DEB -B "$d/deb" > "$d/cpack.log" 2>&1) || { cat "$d/cpack.log"; exit 1; }
  rt=$(ls "$d"/deb/loom_*.deb); dev=$(ls "$d"/deb/loom-dev_*.deb)
  files() { dpkg-deb -c "$1" | awk '/^-/ { print $NF }'; }
  if files "$rt" | grep -v '^\./usr/bin/'; then echo "loom (the tools) ships the files above"; exit 1; fi
  if files "$dev" | grep '^\./usr/bin/'; then echo "loom-dev ships the tools above"; exit 1; fi
  for deb in "$rt" "$dev"; do dpkg-deb -x "$deb" "$d/debroot"; done
  cmake -S "$S/examples/consumer" -B "$d/consumer-deb" -DCMAKE_PREFIX_PATH="$d/debroot/usr" \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release > "$d/configure-deb.log" 2>&1 || { cat "$d/configure-deb.log"; exit 1; }
  cmake --build "$d/consumer-deb" > "$d/build-deb.log" 2>&1 || { cat "$d/build-deb.log"; exit 1; }
  "$d/consumer-deb/consumer" > "$d/deb.log" 2>&1 || { cat "$d/deb.log"; exit 1; }
  grep -q "consumer rank 0 of 1 (single_device)" "$d/deb.log"
  # Their dependencies are not in the scratch root below (--force-depends), so each is checked
  # by name against this machine's database instead: a real install would resolve them.
  depends() { dpkg-deb -f "$1" Depends | sed 's/([^)]*)//g' | tr -d ' ' | tr ',' ' '; }
  for deb in "$rt" "$dev"; do
    for dep in $(depends "$deb"); do
      dpkg -s "$dep" > /dev/null 2>&1 || { echo "$(basename "$deb") depends on '$dep', which no installed package provides"; exit 1; }
    done
  done
  # Each shared library the tools load comes from a package that loom depends on (a library
  # that no Debian package holds, as a CUDA toolkit installed by NVIDIA's installer, excepted).
  needed=$(for f in "$d/prefix/bin/"*; do readelf -d "$f"; done | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u)
  patterns=(); for so in $needed; do patterns+=("*/$so"); done
  dpkg -S "${patterns[@]}" > "$d/owners.txt" 2> /dev/null || true
  rt_depends=" $(depends "$rt") "
  for so in $needed; do
    owners=$(awk -F': /' -v so="$so" '{ n = split($2, p, "/"); if (p[n] == so) print $1 }' "$d/owners.txt" |
             tr ',' '\n' | sed 's/:.*//; s/ //g' | sort -u)
    [ -n "$owners" ] || { echo "the tools load $so, which no Debian package holds: not checked"; continue; }
    named=0
    for owner in $owners; do [[ "$rt_depends" == *" $owner "* ]] && named=1; done
    [ $named = 1 ] || { echo "the tools load $so (from $owners), which loom's Depends does not name"; exit 1; }
  done
  # dpkg -i / -r of both.
  r="$d/dpkgroot"
  mkdir -p "$r/var/lib/dpkg/info" "$r/var/lib/dpkg/updates"
  touch "$r/var/lib/dpkg/status"
  dpkg --root="$r" --force-depends -i "$rt" "$dev" > "$d/dpkg-i.log" 2>&1 || { cat "$d/dpkg-i.log"; exit 1; }
  shipped=0
  for deb in "$rt" "$dev"; do
    package=$(dpkg-deb -f "$deb" Package)
    dpkg --root="$r" -s "$package" | grep -q "^Status: install ok installed"
    listed=$(dpkg --root="$r" -L "$package" | while read -r f; do [ -f "$r$f" ] && echo "$f"; done | wc -l)
    n=$(files "$deb" | wc -l)
    [ "$listed" -eq "$n" ] || { echo "dpkg lists $listed installed files of $package, its .deb ships $n"; exit 1; }
    shipped=$((shipped + n))
  done
  test -x "$r/usr/bin/loomrun"
  test -f "$r/usr/include/loom/strategies/fabric.h"
  dpkg --root="$r" -r loom-dev loom > "$d/dpkg-r.log" 2>&1 || { cat "$d/dpkg-r.log"; exit 1; }
  for package in loom loom-dev; do
    if dpkg --root="$r" -s "$package" > /dev/null 2>&1; then echo "dpkg -r left $package installed"; exit 1; fi
  done
  left=$(find "$r" -mindepth 1 -not -path "$r/var/lib/dpkg*" -type f | head -5)
  [ -z "$left" ] || { echo "dpkg -r left files behind: $left"; exit 1; }
  echo "dpkg installs $shipped files of loom and loom-dev and removes them all"
}
if [ -z "$sanitized" ]; then
  check_debs
else
  echo "a $sanitized-sanitized build: the .deb packages are the release build's"
fi
echo "the installed package builds and runs a consumer"
