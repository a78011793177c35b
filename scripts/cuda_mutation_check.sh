#!/usr/bin/env bash
# Mutation check of the CUDA kernel emulation tests (tests/cuda_emulation, docs/cuda.md):
# plants one known bug at a time in a copy of kernels/cuda, rebuilds the emulated kernels
# from that copy, and counts the bugs that the emulation tests catch.
#
#   scripts/cuda_mutation_check.sh [--only REGEX] [--keep-going] [--check] [--timeout S]
#                                  [--list FILE]
#
#   --only REGEX   run only the mutations whose name matches REGEX (bash =~, e.g. '^softmax\.')
#   --keep-going   report a broken mutation (snippet missing or ambiguous, or a mutant that
#                  does not compile) as ERROR and go on; by default the first one stops the run
#   --check        only check that every snippet in the list occurs exactly once, build nothing
#   --timeout S    seconds each test program may run (default 300); a hang counts as caught
#   --list FILE    read the mutations from FILE instead of scripts/cuda_mutations.txt
#
# What it does: configures build/mutation once (Release, no nvcc needed, no benchmarks) with
# LOOM_EMULATION_KERNEL_DIR pointing at build/mutation/mutant_kernels, a copy of kernels/cuda
# (kernels/cuda itself is never written). It first checks that every snippet of
# scripts/cuda_mutations.txt occurs exactly once in its file, then that the unmutated copy
# passes every test program it will use. Then, per mutation: a fresh copy, the one
# replacement, a rebuild of the test programs that cover the file, and a run of each. A
# mutation is caught when a program fails, crashes or times out; a mutant that does not
# compile is a broken mutation (ERROR), not a catch. One line per mutation, then
# "caught N of M planted bugs (P%)". Logs stay in build/mutation/logs/.
#
# Exit status: 0 when at least 90% are caught, 1 below that, 2 when the list or the setup is
# broken (missing or ambiguous snippet, a mutant that does not compile, unmutated tests failing).
#
# Time: about 7 to 11 minutes for the whole list on 2 cores (61 mutants, 2 to 55 s each), after a
# first build of about 2 minutes. Each mutant recompiles one emulated kernel source (all of
# them for common.cuh) and reruns the programs that cover it.
# CMAKE_BUILD_PARALLEL_LEVEL sets the build's parallelism as usual.
#
# Adding a mutation: append a block to scripts/cuda_mutations.txt (format at its top). The
# snippet must occur exactly once in its file (add surrounding text until it does; "\n" stands
# for a line break), and the mutant must compile and be a real bug: a change that some input a
# user could give turns into a wrong result, not an equivalent program. Run with
# --only '^its-name$' to try it.

set -euo pipefail
export LC_ALL=C             # byte-exact string lengths and comparisons
shopt -u patsub_replacement 2>/dev/null || true  # bash 5.2: '&' in a replacement is literal

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source_dir=$root/kernels/cuda
list=$root/scripts/cuda_mutations.txt
build=$root/build/mutation
mutant_dir=$build/mutant_kernels  # fixed path: the build folder stays valid between mutants
logs=$build/logs
threshold=90
all_tests=(test_attention test_comm_ops test_copy test_elementwise test_embedding test_layer_norm
           test_optimizer test_reduce test_rotary test_softmax)

only=''
keep_going=0
check_only=0
timeout_s=300

die() {
  echo "cuda_mutation_check: $*" >&2
  exit 2
}

usage() {
  sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
  exit 2
}

while (($#)); do
  case $1 in
    --only) (($# >= 2)) || die "--only needs a pattern"; only=$2; shift 2 ;;
    --keep-going) keep_going=1; shift ;;
    --check) check_only=1; shift ;;
    --list) (($# >= 2)) || die "--list needs a file"; list=$(realpath -- "$2"); shift 2 ;;
    --timeout)
      [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "--timeout needs a positive number of seconds"
      timeout_s=$2; shift 2 ;;
    -h | --help) usage ;;
    *) echo "cuda_mutation_check: unknown argument '$1'" >&2; usage ;;
  esac
done

# ---- The list ------------------------------------------------------------------------------

names=() files=() catches=() whats=() finds=() replaces=() lines=()

trim() {  # prints $1 without leading and trailing blanks
  local s=$1
  s=${s#"${s%%[![:space:]]*}"}
  s=${s%"${s##*[![:space:]]}"}
  printf '%s' "$s"
}

# Reads scripts/cuda_mutations.txt into the arrays above; dies naming the line of an error.
read_list() {
  [[ -f $list ]] || die "no mutation list at $list"
  local line key value n=-1 lineno=0
  while IFS= read -r line || [[ -n $line ]]; do
    lineno=$((lineno + 1))
    [[ $line =~ ^[[:space:]]*(#.*)?$ ]] && continue
    [[ $line =~ ^([a-z]+):(.*)$ ]] || die "$list:$lineno: expected 'key: value', got '$line'"
    key=${BASH_REMATCH[1]}
    value=$(trim "${BASH_REMATCH[2]}")
    value=${value//\\n/$'\n'}
    if [[ $key == mutation ]]; then
      [[ $value =~ ^[A-Za-z0-9_.-]+$ ]] ||
        die "$list:$lineno: mutation names use letters, digits, '.', '_' and '-', got '$value'"
      local existing
      for existing in "${names[@]}"; do
        [[ $existing != "$value" ]] || die "$list:$lineno: mutation '$value' is named twice"
      done
      n=$((n + 1))
      names[n]=$value lines[n]=$lineno
      continue
    fi
    ((n >= 0)) || die "$list:$lineno: '$key' before the first 'mutation:'"
    case $key in
      file) files[n]=$value ;;
      catch) catches[n]=$value ;;
      what) whats[n]=$value ;;
      find) finds[n]=$value ;;
      replace) replaces[n]=$value ;;
      *) die "$list:$lineno: unknown key '$key' (expected mutation, file, catch, what, find, replace)" ;;
    esac
  done <"$list"
  ((n >= 0)) || die "$list holds no mutation"
  local i where
  for ((i = 0; i <= n; i++)); do
    where="$list:${lines[i]}: mutation '${names[i]}'"
    [[ -n ${files[i]:-} ]] || die "$where has no 'file:'"
    [[ -n ${catches[i]:-} ]] || die "$where has no 'catch:' (the test programs that should fail)"
    [[ -n ${whats[i]:-} ]] || die "$where has no 'what:' (a one-line description)"
    [[ -n ${finds[i]:-} ]] || die "$where has no 'find:'"
    [[ -v "replaces[$i]" ]] || die "$where has no 'replace:' line (it may be empty)"
    [[ ${finds[i]} != "${replaces[i]}" ]] || die "$where replaces its snippet by itself"
  done
}

# The test programs that exercise a kernel source: its own, plus those that reach it through
# another source (comm_ops' convert calls copy.cu's copy_strided; elementwise.cu and copy.cu
# share strided_layout.cuh); all for common.cuh.
covering_tests() {
  case $1 in
    common.cuh) echo "${all_tests[*]}" ;;
    attention.cu | attention_*.cuh) echo test_attention ;;
    copy.cu) echo test_copy test_comm_ops ;;
    strided_layout.cuh) echo test_elementwise test_copy test_comm_ops ;;
    *.cu) echo "test_${1%.cu}" ;;
    *) return 1 ;;
  esac
}

# Occurrences of the literal string $2 in the text $1.
count_in() {
  local rest=${1//"$2"/}
  echo $(((${#1} - ${#rest}) / ${#2}))
}

read_file() {  # sets `text` to the whole file, trailing newlines included
  text=''
  IFS= read -r -d '' text <"$1" || true
}

# Checks mutation i against kernels/cuda; prints the reason and fails when it is broken.
check_mutation() {
  local i=$1 file=${files[$1]} tests count text program
  [[ -f $source_dir/$file ]] || { echo "file kernels/cuda/$file does not exist"; return 1; }
  tests=$(covering_tests "$file") || { echo "no test program covers $file"; return 1; }
  for program in ${catches[i]}; do
    [[ " $tests " == *" $program "* ]] ||
      { echo "catch: $program does not run for $file (runs: $tests)"; return 1; }
  done
  read_file "$source_dir/$file"
  count=$(count_in "$text" "${finds[i]}")
  if ((count == 0)); then
    echo "its snippet no longer occurs in kernels/cuda/$file (the kernel changed: update or drop the mutation)"
    return 1
  elif ((count > 1)); then
    echo "its snippet occurs $count times in kernels/cuda/$file (add surrounding text until it is unique)"
    return 1
  fi
}

read_list
total=${#names[@]}
selected=()
for ((i = 0; i < total; i++)); do
  if [[ -z $only || ${names[i]} =~ $only ]]; then selected+=("$i"); fi
done
((${#selected[@]})) || die "--only '$only' matches none of the $total mutations"

# Every snippet is checked, selected or not, so that the list cannot rot unseen.
declare -A broken=()
for ((i = 0; i < total; i++)); do
  if reason=$(check_mutation "$i"); then continue; fi
  broken[$i]=$reason
  echo "ERROR   ${names[i]} ($list:${lines[i]}): $reason" >&2
done
if ((${#broken[@]})) && ((!keep_going || check_only)); then
  die "${#broken[@]} broken mutation(s) in $list; fix them (or run with --keep-going to skip them)"
fi
if ((check_only)); then
  echo "all $total mutations in $list apply exactly once"
  exit 0
fi

# ---- Build folder and mutant copy -----------------------------------------------------------

mkdir -p "$build" "$logs"
exec 9>"$build/.lock"
flock -n 9 || die "another cuda_mutation_check.sh is using $build; wait for it to finish"
cleanup() { rm -rf "$mutant_dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# A fresh copy of kernels/cuda. Fresh modification times on purpose: the rewrite step then
# runs for every file, writes only outputs whose text changed, and Ninja recompiles those.
fresh_copy() {
  rm -rf "$mutant_dir"
  cp -R "$source_dir" "$mutant_dir"
}

# Applies mutation i to the copy (its snippet was checked to occur exactly once).
apply_mutation() {
  local i=$1 path=$mutant_dir/${files[$1]} text
  read_file "$path"
  [[ $(count_in "$text" "${finds[i]}") == 1 ]] || die "mutation '${names[i]}' no longer applies to the copy"
  printf '%s' "${text/"${finds[i]}"/"${replaces[i]}"}" >"$path"
}

configure() {
  local cache=$build/CMakeCache.txt
  if [[ -f $cache ]] && grep -qxF "LOOM_EMULATION_KERNEL_DIR:PATH=$mutant_dir" "$cache"; then
    return
  fi
  echo "configuring $build (log: $logs/configure.log)"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_WITH_CUDA=OFF \
    -DLOOM_BUILD_BENCHMARKS=OFF -DLOOM_BUILD_TESTS=ON -DLOOM_FUZZ=OFF -DLOOM_SANITIZE=OFF \
    -DLOOM_EMULATION_KERNEL_DIR="$mutant_dir" >"$logs/configure.log" 2>&1 ||
    die "configuring $build failed; see $logs/configure.log"
  grep -q '^test_softmax:' <(cmake --build "$build" --target help 2>/dev/null) ||
    die "the configured build has no kernel emulation tests: CMake found no CUDA toolkit headers " \
        "(install the CUDA toolkit, or point CUDAToolkit_ROOT at it); see $logs/configure.log"
}

# Builds the given test programs; the log goes to $1.
build_tests() {
  local log=$1
  shift
  cmake --build "$build" --target "$@" >"$log" 2>&1
}

# Runs one test program; prints "" when it passes, else how it failed and its first failing
# test. The log goes to $2.
run_test() {
  local program=$1 log=$2 rc=0 first
  timeout -k 10 "$timeout_s" "$build/tests/cuda_emulation/$program" --gtest_color=no >"$log" 2>&1 || rc=$?
  ((rc == 0)) && return 0
  first=$(sed -n 's/^\[  FAILED  \] \([^ ,]*\).*/\1/p' "$log" | head -n 1)
  if ((rc == 124 || rc == 137)); then
    echo "timed out after ${timeout_s}s"
  elif ((rc > 128)); then
    echo "crashed (SIG$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128))))${first:+ in $first}"
  else
    echo "${first:-failed (exit $rc)}"
  fi
}

# ---- Baseline: the unmutated copy passes -----------------------------------------------------

declare -A needed_set=()
for i in "${selected[@]}"; do
  [[ -v "broken[$i]" ]] && continue
  for program in $(covering_tests "${files[i]}"); do needed_set[$program]=1; done
done
needed=()
for program in "${all_tests[@]}"; do
  if [[ -v "needed_set[$program]" ]]; then needed+=("$program"); fi
done
((${#needed[@]})) || die "every selected mutation is broken; nothing to run"

start=$SECONDS
fresh_copy  # before configure: CMake globs the copy's sources (none yet in a new checkout)
configure
echo "building the unmutated copy: ${needed[*]} (log: $logs/baseline.build.log)"
build_tests "$logs/baseline.build.log" "${needed[@]}" ||
  die "the unmutated kernels do not build; see $logs/baseline.build.log"
for program in "${needed[@]}"; do
  if failure=$(run_test "$program" "$logs/baseline.$program.log") && [[ -z $failure ]]; then
    continue
  fi
  die "the unmutated kernels fail $program ($failure); see $logs/baseline.$program.log." \
      "Fix the kernels or the tests first: a mutation count means nothing on a failing suite"
done
echo "unmutated copy passes ${needed[*]} ($((SECONDS - start))s)"

# ---- Mutants --------------------------------------------------------------------------------

caught=0 planted=0 errors=0 done_count=0
missed_names=() error_names=()
for i in "${selected[@]}"; do
  done_count=$((done_count + 1))
  name=${names[i]} what=${whats[i]}
  tag=$(printf '[%2d/%d]' "$done_count" "${#selected[@]}")
  if [[ -v "broken[$i]" ]]; then
    echo "$tag ERROR   $name: ${broken[$i]}"
    errors=$((errors + 1)) error_names+=("$name")
    continue
  fi
  mutant_start=$SECONDS
  read -r -a tests <<<"$(covering_tests "${files[i]}")"
  fresh_copy
  apply_mutation "$i"
  if ! build_tests "$logs/$name.build.log" "${tests[@]}"; then
    echo "$tag ERROR   $name: the mutant does not compile, so it plants no bug; fix its replacement (log: $logs/$name.build.log)"
    errors=$((errors + 1)) error_names+=("$name")
    ((keep_going)) || die "stopping at the broken mutation '$name' (--keep-going goes on)"
    continue
  fi
  caught_by=()
  for program in "${tests[@]}"; do
    failure=$(run_test "$program" "$logs/$name.$program.log")
    [[ -z $failure ]] || caught_by+=("$program: $failure")
  done
  planted=$((planted + 1))
  seconds=$((SECONDS - mutant_start))
  if ((${#caught_by[@]})); then
    caught=$((caught + 1))
    by=$(IFS=';'; echo "${caught_by[*]}")
    echo "$tag caught  $name: $what [${by//;/; }] (${seconds}s)"
  else
    missed_names+=("$name")
    echo "$tag MISSED  $name: $what [passed ${tests[*]}; expected ${catches[i]} to fail] (${seconds}s)"
  fi
done

# ---- Summary --------------------------------------------------------------------------------

echo
if ((planted == 0)); then
  die "no mutation was planted (${errors} broken)"
fi
percent=$((caught * 1000 / planted))
echo "caught $caught of $planted planted bugs ($((percent / 10)).$((percent % 10))%) in $((SECONDS - start))s"
((${#missed_names[@]} == 0)) || echo "missed: ${missed_names[*]}"
if ((errors)); then
  echo "broken mutations (not counted): ${error_names[*]}"
  exit 2
fi
((caught * 100 >= threshold * planted)) || exit 1
