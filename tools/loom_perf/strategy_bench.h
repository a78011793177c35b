#pragma once
// loom-perf strategy: the sharding-throughput benchmark. Times train_gpt's training loop
// (tools/train_gpt/trainer.h) under any registered strategy on a GPT fed synthetic tokens
// and reports, per step and rank: the step time (median over the timed steps, the slowest
// rank's), the bytes each collective moved, the communication the training thread waited
// for (not hidden behind compute, summed from the trace's wait spans), and the peak memory
// by kind of every rank. Text on stdout, --csv and --json files (docs/sharding.md).
//
//   loom-perf strategy --strategy deepspeed_stage_3 --layers 8 --embd 512 --np 2

namespace loom::perf {

// argv[1] is "strategy". Returns the process exit code (0 success, 1 failure, 2 bad usage).
int strategy_main(int argc, char** argv);

}  // namespace loom::perf
