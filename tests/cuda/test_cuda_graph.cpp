// CUDA Graphs (Note [CUDA Graphs] in tensor/cuda/graph.h): ops, a matmul and a backward pass
// captured once and replayed on new inputs give the bits eager execution gives; a capture
// that waits for the device fails with a message saying so, and leaves the device usable.
// Needs a GPU (skipped, by name, where there is none); also runs on the emulated device
// (emulated.CudaGraph.*), whose runtime records and replays captures.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "tensor/cuda/graph.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tests/cuda/gpu_test_util.h"

namespace loom {
namespace {

using gpu_test::kGpu;
using gpu_test::random_tensor;

std::vector<float> host_values(const Tensor& t) {
  return t.to(Device::cpu()).to_vector<float>();
}

TEST(CudaGraph, ReplaysOpsOnNewInputsWithTheBitsOfEagerExecution) {
  SKIP_WITHOUT_GPU();
  Tensor x = random_tensor({16, 24}, 1).to(kGpu);
  const Tensor w = random_tensor({24, 8}, 2).to(kGpu);
  const Tensor b = random_tensor({8}, 3).to(kGpu);
  auto compute = [&] { return gelu(add(matmul(x, w), b)); };
  cuda::Graph graph(0);
  Tensor y;
  graph.capture([&] { y = compute(); });
  ASSERT_TRUE(graph.captured());
  for (uint64_t seed = 10; seed < 13; ++seed) {
    copy_(x, random_tensor({16, 24}, seed));
    graph.replay();
    EXPECT_EQ(host_values(y), host_values(compute())) << "inputs of seed " << seed;
  }
}

TEST(CudaGraph, ReplaysABackwardPassIntoTheGradientsItLeft) {
  SKIP_WITHOUT_GPU();
  Tensor x = random_tensor({8, 12}, 4).to(kGpu);
  Tensor w = random_tensor({12, 6}, 5).to(kGpu).set_requires_grad(true);
  auto loss_of = [&] { return sum(mul(matmul(x, w), matmul(x, w))); };
  cuda::Graph graph(0);
  Tensor loss;
  graph.capture([&] {
    loss = loss_of();
    loss.backward();
  });
  const Tensor grad = w.grad();  // left by the capture, rewritten by each replay
  ASSERT_TRUE(grad.defined());
  for (uint64_t seed = 20; seed < 22; ++seed) {
    copy_(x, random_tensor({8, 12}, seed));
    graph.replay();
    const std::vector<float> replayed_loss = host_values(loss), replayed_grad = host_values(grad);
    w.set_grad(Tensor());
    Tensor eager = loss_of();
    eager.backward();
    EXPECT_EQ(replayed_loss, host_values(eager));
    EXPECT_EQ(replayed_grad, host_values(w.grad()));
  }
}

TEST(CudaGraph, ACaptureThatWaitsForTheDeviceFailsAndSaysWhy) {
  SKIP_WITHOUT_GPU();
  const Tensor x = random_tensor({4, 4}, 6).to(kGpu);
  cuda::Graph graph(0);
  try {
    graph.capture([&] { (void)sum(x).item(); });
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("Graph::capture on cuda:0"), std::string::npos) << text;
    EXPECT_NE(text.find("StreamCapture"), std::string::npos) << text;
    EXPECT_NE(text.find("nothing in the captured function may wait for the device"),
              std::string::npos)
        << text;
  }
  EXPECT_FALSE(graph.captured());
  EXPECT_THROW(graph.replay(), Error);
  // The device and the allocator are usable afterwards, eagerly and for a new capture.
  EXPECT_EQ(sum(x).item(), sum(x.to(Device::cpu())).item());
  Tensor y;
  graph.capture([&] { y = mul(x, 2.0); });
  graph.replay();
  EXPECT_EQ(host_values(y), host_values(mul(x, 2.0)));
  EXPECT_THROW(graph.capture([] {}), Error) << "one capture per Graph";
}

TEST(CudaGraph, MemoryTheCaptureUsedIsNotLentOutWhileTheGraphLives) {
  SKIP_WITHOUT_GPU();
  const Tensor x = random_tensor({256}, 7).to(kGpu);
  Tensor y;
  std::vector<float> want;
  {
    cuda::Graph graph(0);
    graph.capture([&] {
      Tensor scratch = mul(x, 3.0);  // freed inside the capture, written by every replay
      y = add(scratch, 1.0);
    });
    Tensor eager = mul(x, 5.0);  // same size: must not land on the capture's scratch
    want = host_values(eager);
    graph.replay();
    EXPECT_EQ(host_values(eager), want);
    EXPECT_EQ(host_values(y), host_values(add(mul(x, 3.0), 1.0)));
  }
  EXPECT_EQ(host_values(y), host_values(add(mul(x, 3.0), 1.0))) << "y outlives its graph";
}

}  // namespace
}  // namespace loom
