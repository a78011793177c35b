#include "comm/ucx/ucx_backend.h"

#include <sched.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "comm/cpu_relax.h"
#include "comm/reduce_op.h"
#include "core/tags.h"

namespace loom::comm::ucx {

// Note [UCX collectives]
// The backend is a Transport: send, recv and send_recv are UCX tagged messages whose tag is
// the sending rank, received with the full tag mask, so each ordered pair of ranks is one
// ordered stream (UCX matches the messages of one sender and one tag in order). Collectives
// are the generic algorithms over it (TransportBackend, Note [Collectives over a
// Transport]). The group runs one operation at a time, so one thread at a time drives the
// worker (UCS_THREAD_MODE_SERIALIZED).

namespace {

constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};

ucp_tag_t stream_tag(int sender) {
  return static_cast<ucp_tag_t>(sender);
}

std::string text(ucs_status_t status) {
  return ucs_status_string(status);
}

// Note [UCX defaults for TCP]
// UCX's own defaults suit RDMA networks. Over TCP they cost Loom its goal against Open MPI
// between two hosts (docs/performance_comm.md, "ucx and hierarchical between namespace
// hosts"): from UCX's automatic rendezvous threshold up, a message waits a round trip for the
// receiver's answer before its data moves (64 KiB took 2x Open MPI's time), and TCP's 8 KiB
// send segments cut a large message into many small writes (4 and 16 MiB took 1.1x to 1.2x).
// So, unless the user set the variable:
//  - UCX_RNDV_THRESH=1M: messages below 1 MiB go eagerly (above it the round trip is a few
//    percent of the transfer, and a receiver never buffers more than 1 MiB unexpected). Left
//    to UCX where an RDMA device exists (/sys/class/infiniband): there rendezvous is
//    zero-copy and pays from a few KiB.
//  - UCX_TCP_TX_SEG_SIZE=64K and UCX_TCP_RX_SEG_SIZE=513K (ucp_config_modify hands
//    transport variables on without their transport's prefix; only tcp has these two). The
//    receive segment is also UCX's limit on a zero-copy fragment: at 513K a 512 KiB piece of
//    a rank-ordered reduction (kPieceBytes, Note [Pieces of a rank-ordered reduction]) with
//    its headers goes in one write, where 256K made two and a third of a few dozen bytes,
//    each ending in a short packet (a 4 MiB allreduce sent 1.2x the packets Open MPI's does,
//    and took about 3% longer; docs/performance_comm.md, "2026-11-29 (later)").
// A value in the environment always wins.
struct TunedDefault {
  const char* name;      // as ucp_config_modify takes it
  const char* variable;  // the environment variable that overrides it
  const char* value;
  bool tcp_only;  // applied only where no RDMA device exists
};
constexpr TunedDefault kTunedDefaults[] = {
    {"RNDV_THRESH", "UCX_RNDV_THRESH", "1M", true},
    {"TX_SEG_SIZE", "UCX_TCP_TX_SEG_SIZE", "64K", false},
    {"RX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE", "513K", false},
};

// Applies kTunedDefaults to `config`; releases it before throwing.
void apply_tuned_defaults(ucp_config_t* config, const std::string& me) {
  const bool rdma = has_rdma_device();
  for (const TunedDefault& d : kTunedDefaults) {
    if (std::getenv(d.variable) != nullptr) continue;
    if (d.tcp_only && rdma) continue;
    if (ucs_status_t status = ucp_config_modify(config, d.name, d.value); status != UCS_OK) {
      ucp_config_release(config);
      fail(me, "setting ", d.variable, "=", d.value, " failed: ", text(status), "; set ",
           d.variable, " in the environment to choose a value yourself");
    }
  }
}

}  // namespace

struct UcxBackend::State {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<ucp_ep_h> endpoints;  // by peer rank; null for this rank
  // The first error each peer's endpoint reported (UCS_OK while none). Written by the error
  // handler, which UCX calls from ucp_worker_progress on the thread driving the worker.
  std::vector<ucs_status_t> peer_errors;
  std::vector<std::string> hosts;  // each rank's host, for messages (host_label())
  struct ErrorArg {
    State* state;
    int peer;
  };
  std::vector<ErrorArg> error_args;  // the handlers' arguments, one per rank

  static void on_endpoint_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* where = static_cast<ErrorArg*>(arg);
    ucs_status_t& slot = where->state->peer_errors[static_cast<size_t>(where->peer)];
    if (slot == UCS_OK) slot = status;
  }

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  // Closes the endpoints, then the worker and the context: also when the constructor failed
  // halfway.
  // Every endpoint's close starts at once and all of them share one second, so a group of
  // any size closes within a second even if peers do not answer.
  ~State() {
    std::vector<void*> closing;
    for (size_t r = 0; r < endpoints.size(); ++r) {
      void* request = start_close(static_cast<int>(r), /*force=*/peer_errors[r] != UCS_OK);
      if (request != nullptr) closing.push_back(request);
    }
    const Deadline until = Clock::now() + std::chrono::seconds(1);
    auto in_progress = [&] {
      return std::any_of(closing.begin(), closing.end(), [](void* request) {
        return ucp_request_check_status(request) == UCS_INPROGRESS;
      });
    };
    while (in_progress() && Clock::now() < until)
      ucp_worker_progress(worker);
    for (void* request : closing)
      ucp_request_free(request);
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
  }

  // Drives the worker until `request` is no longer in progress, at most a second.
  void settle(void* request) {
    const Deadline until = Clock::now() + std::chrono::seconds(1);
    while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < until)
      ucp_worker_progress(worker);
  }

  // Starts closing the endpoint to `peer`; returns the request to wait for (null: closed
  // already, or no endpoint). Normally with a flush: an eager send completes for its caller
  // once UCX holds the data, not once the peer has it, so a rank whose last operation was a
  // send would otherwise drop it in flight and its peer would see an endpoint error. Forced
  // where the peer failed or a send is abandoned: no handshake with a peer that may be gone;
  // sends still in flight complete as canceled.
  void* start_close(int peer, bool force) {
    ucp_ep_h& ep = endpoints[static_cast<size_t>(peer)];
    if (ep == nullptr) return nullptr;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
    ep = nullptr;
    return UCS_PTR_IS_PTR(request) ? request : nullptr;
  }

  // After a failure (the group is broken from then on): a receive in flight is canceled; a
  // send is canceled by closing its endpoint, so that UCX no longer reads the caller's buffer.
  void abandon_receive(void* request) {
    if (request == nullptr) return;
    ucp_request_cancel(worker, request);
    settle(request);
    ucp_request_free(request);
  }
  void abandon_send(void* request, int peer) {
    if (request == nullptr) return;
    if (void* closing = start_close(peer, /*force=*/true); closing != nullptr) {
      settle(closing);
      ucp_request_free(closing);
    }
    settle(request);
    ucp_request_free(request);
  }
};

UcxBackend::UcxBackend(const BackendContext& context)
    : rank_(context.rank), size_(context.size), state_(std::make_unique<State>()) {
  State& s = *state_;
  const std::string me = tag::kCommUcx.prefix() + "rank " + std::to_string(rank_) + ": ";
  ucp_config_t* config = nullptr;
  if (ucs_status_t status = ucp_config_read(nullptr, nullptr, &config); status != UCS_OK) {
    fail(me, "reading the UCX configuration (the UCX_* variables) failed: ", text(status));
  }
  apply_tuned_defaults(config, me);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  const ucs_status_t initialized = ucp_init(&params, config, &s.context);
  ucp_config_release(config);
  if (initialized != UCS_OK) fail(me, "ucp_init failed: ", text(initialized));
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  if (ucs_status_t status = ucp_worker_create(s.context, &worker_params, &s.worker);
      status != UCS_OK) {
    fail(me, "ucp_worker_create failed: ", text(status));
  }
  ucp_address_t* address = nullptr;
  size_t address_bytes = 0;
  if (ucs_status_t status = ucp_worker_get_address(s.worker, &address, &address_bytes);
      status != UCS_OK) {
    fail(me, "ucp_worker_get_address failed: ", text(status));
  }
  const auto* first = reinterpret_cast<const uint8_t*>(address);
  Bytes mine(first, first + address_bytes);
  ucp_worker_release_address(s.worker, address);
  context.store->set("ucx/address/" + std::to_string(rank_), mine);
  context.store->set("ucx/host/" + std::to_string(rank_), to_bytes(host_label()));

  s.endpoints.assign(static_cast<size_t>(size_), nullptr);
  s.peer_errors.assign(static_cast<size_t>(size_), UCS_OK);
  s.hosts.assign(static_cast<size_t>(size_), host_label());
  for (int r = 0; r < size_; ++r)
    s.error_args.push_back({&s, r});
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Bytes peer = context.store->get("ucx/address/" + std::to_string(r), context.timeout);
    s.hosts[static_cast<size_t>(r)] =
        to_string(context.store->get("ucx/host/" + std::to_string(r), context.timeout));
    ucp_ep_params_t ep_params{};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(peer.data());
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = &State::on_endpoint_error;
    ep_params.err_handler.arg = &s.error_args[static_cast<size_t>(r)];
    if (ucs_status_t status = ucp_ep_create(s.worker, &ep_params, &s.endpoints[r]);
        status != UCS_OK) {
      fail(me, "connecting to rank ", r, " (ucp_ep_create) failed: ", text(status));
    }
  }
}

UcxBackend::~UcxBackend() = default;

// Both directions are posted before the worker is driven, so two ranks that send to each
// other at once never wait on each other, whatever the message sizes.
void UcxBackend::send_recv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                           size_t recv_bytes, int src, Deadline deadline) {
  State& s = *state_;
  const std::string me = tag::kCommUcx.prefix() + "rank " + std::to_string(rank_) + ": ";
  void* receiving = nullptr;
  void* sending = nullptr;
  // Abandons what is in flight, then throws `error`.
  auto give_up = [&](const CommError& error) {
    s.abandon_receive(receiving);
    s.abandon_send(sending, dst);
    throw error;
  };
  auto named = [&](int peer) {
    return "peer " + std::to_string(peer) + " (host " + s.hosts[static_cast<size_t>(peer)] + ")";
  };
  auto peer_failed = [&](int peer, ucs_status_t status, const char* what) {
    give_up(CommError(me + named(peer) + " failed (" + text(status) +
                          ") while this rank waited for it to " + what,
                      rank_, peer, CommFailure::PeerDied));
  };
  if (recv_bytes > 0) {
    ucp_request_param_t param{};
    ucs_status_ptr_t request =
        ucp_tag_recv_nbx(s.worker, recv_data, recv_bytes, stream_tag(src), kFullMask, &param);
    if (UCS_PTR_IS_ERR(request)) peer_failed(src, UCS_PTR_STATUS(request), "send its message");
    receiving = request;
  }
  if (send_bytes > 0) {
    if (s.endpoints[static_cast<size_t>(dst)] == nullptr) {
      give_up(CommError(me + "the connection to rank " + std::to_string(dst) +
                            " was closed after an earlier failure; create a new group",
                        rank_, dst));
    }
    ucp_request_param_t param{};
    ucs_status_ptr_t request =
        ucp_tag_send_nbx(s.endpoints[static_cast<size_t>(dst)], send_data, send_bytes,
                         stream_tag(rank_), &param);
    if (UCS_PTR_IS_ERR(request)) {
      peer_failed(dst, UCS_PTR_STATUS(request), "receive this rank's message");
    }
    sending = request;  // null: sent already
  }
  const Clock::time_point start = Clock::now();
  uint32_t spins = 0;
  while (receiving != nullptr || sending != nullptr) {
    ucp_worker_progress(s.worker);
    if (sending != nullptr) {
      const ucs_status_t status = ucp_request_check_status(sending);
      if (status != UCS_INPROGRESS) {
        ucp_request_free(sending);
        sending = nullptr;
        if (status != UCS_OK) peer_failed(dst, status, "receive this rank's message");
      }
    }
    if (receiving != nullptr) {
      ucp_tag_recv_info_t info{};
      const ucs_status_t status = ucp_tag_recv_request_test(receiving, &info);
      if (status != UCS_INPROGRESS) {
        ucp_request_free(receiving);
        receiving = nullptr;
        if (status == UCS_ERR_MESSAGE_TRUNCATED || (status == UCS_OK && info.length != recv_bytes)) {
          give_up(CommError(me + named(src) + " sent a message of " +
                                (status == UCS_OK ? std::to_string(info.length) : "more") +
                                " bytes where " + std::to_string(recv_bytes) +
                                " were expected: the ranks run different collectives or sizes",
                            rank_, src, CommFailure::Mismatch));
        }
        if (status != UCS_OK) peer_failed(src, status, "send its message");
      }
    }
    if (++spins % 256 != 0) continue;
    // Now and then: a peer's endpoint error, the deadline, and the core for others.
    if (receiving != nullptr && s.peer_errors[static_cast<size_t>(src)] != UCS_OK) {
      peer_failed(src, s.peer_errors[static_cast<size_t>(src)], "send its message");
    }
    if (sending != nullptr && s.peer_errors[static_cast<size_t>(dst)] != UCS_OK) {
      peer_failed(dst, s.peer_errors[static_cast<size_t>(dst)], "receive this rank's message");
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      const int late = receiving != nullptr ? src : dst;
      give_up(CommError(me + named(late) + " did not " +
                            (receiving != nullptr ? "send its message" : "receive this rank's message") +
                            " before the deadline",
                        rank_, late, CommFailure::Timeout));
    }
    // After kSpinBeforeYielding (comm/cpu_relax.h) of driving the worker without pause, the
    // core is yielded at every such check; where nothing else is runnable that returns at once.
    if (now - start > kSpinBeforeYielding) sched_yield();
  }
}

}  // namespace loom::comm::ucx
