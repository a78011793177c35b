# Sourced by the checkpoint tests.
# The flags without those that only concern checkpoints (--async-save, --checkpoint-format F),
# which train_gpt refuses in a run without --checkpoint-dir: the uninterrupted run's flags.
training_flags() {
  local skip=0 a
  for a in "$@"; do
    if [ "$skip" = 1 ]; then skip=0; continue; fi
    case "$a" in
      --async-save) ;;
      --checkpoint-format) skip=1 ;;
      *) printf '%s\n' "$a" ;;
    esac
  done
}
