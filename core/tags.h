#pragma once
// Every component's message tag, declared once (core/error.h, Tag): messages start with
// "[<name>] " so that a log line says where it came from. A new component adds its tag
// here; call sites write tag::kCheckpoint.fail(...), never the bracketed name by hand.

#include "core/error.h"

namespace loom::tag {

inline constexpr Tag kAutograd{"autograd"};
inline constexpr Tag kCheckpoint{"checkpoint"};
inline constexpr Tag kComm{"comm"};
inline constexpr Tag kCommAlgorithms{"comm/algorithms"};
inline constexpr Tag kCommEnv{"comm/env"};
inline constexpr Tag kCommNccl{"comm/nccl"};
inline constexpr Tag kCommShm{"comm/shm"};
inline constexpr Tag kCommStaging{"comm/staging"};
inline constexpr Tag kCommStore{"comm/store"};
inline constexpr Tag kCommTcp{"comm/tcp"};
inline constexpr Tag kCommThread{"comm/thread"};
inline constexpr Tag kCommUcx{"comm/ucx"};
inline constexpr Tag kCuda{"cuda"};
inline constexpr Tag kData{"data"};
inline constexpr Tag kDdp{"ddp"};
inline constexpr Tag kDdpPowersgd{"ddp/powersgd"};
inline constexpr Tag kDdpFork{"ddp_fork"};
inline constexpr Tag kDeepspeedConfig{"deepspeed-config"};
inline constexpr Tag kDp{"dp"};
inline constexpr Tag kFabric{"fabric"};
inline constexpr Tag kFsdp{"fsdp"};
inline constexpr Tag kKernels{"kernels"};
inline constexpr Tag kKernelsCpu{"kernels/cpu"};
inline constexpr Tag kKernelsCuda{"kernels/cuda"};
inline constexpr Tag kKernelsCudaCommOps{"kernels/cuda/comm_ops"};
inline constexpr Tag kKernelsCudaGemm{"kernels/cuda/gemm"};
inline constexpr Tag kKernelsReduceOps{"kernels/reduce_ops"};
inline constexpr Tag kLaunch{"launch"};
inline constexpr Tag kLoom{"loom"};
inline constexpr Tag kLoomPerf{"loom-perf"};
inline constexpr Tag kLoomSim{"loom-sim"};
inline constexpr Tag kLoomTokenize{"loom-tokenize"};
inline constexpr Tag kLoomTrace{"loom-trace"};
inline constexpr Tag kLoomrun{"loomrun"};
inline constexpr Tag kMemory{"memory"};
inline constexpr Tag kMesh{"mesh"};
inline constexpr Tag kModelAveraging{"model_averaging"};
inline constexpr Tag kModelParallel{"model_parallel"};
inline constexpr Tag kNvme{"nvme"};
inline constexpr Tag kOptim{"optim"};
inline constexpr Tag kPipeline{"pipeline"};
inline constexpr Tag kPrecision{"precision"};
inline constexpr Tag kPretrained{"pretrained"};
inline constexpr Tag kSafetensors{"safetensors"};
inline constexpr Tag kSharded{"sharded"};
inline constexpr Tag kStrategiesMetricSync{"strategies/metric_sync"};
inline constexpr Tag kStrategiesSampler{"strategies/sampler"};
inline constexpr Tag kStrategy{"strategy"};
inline constexpr Tag kTensor{"tensor"};
inline constexpr Tag kTokenizer{"tokenizer"};
inline constexpr Tag kTp{"tp"};
inline constexpr Tag kTrace{"trace"};
inline constexpr Tag kTrainGpt{"train_gpt"};

}  // namespace loom::tag
