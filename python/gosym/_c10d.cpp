// gosym._c10d: the "gosym" group as torch's C++ ProcessGroup calls it.
//
// torch hands a Python ProcessGroup's ops to its Python methods, so every eager op of a
// Python group pays the trampoline into Python and gosym's Python (docs/ARCHITECTURE.md, "The
// group torch calls"). This c10d::Backend is what the creator returns instead: torch builds
// its own C++ ProcessGroup around it and dispatches dist.<op> here without Python. The short
// path (one dense contiguous tensor or pair on the group's CUDA device, or a synchronous
// dense host op) packs the engine's gosym_op_desc and makes the one native call the Python
// group's short path makes; everything else goes to the wrapped ProcessGroupGosym's method
// of the same name, with the GIL taken, so there is one implementation of every op.
//
// A group across hosts gets Hier, a Group whose short path is the flat group's own op (NCCL's
// on CUDA tensors, Gloo's on host tensors of a synchronous op) for the ops its Python group's
// choice runs flat.
//
// The engine's entry points come as addresses from the ctypes library the Python package
// loaded (this module links torch, never libgosym). The Python group shares two int64 cells
// with this one: its endpoint handle (0 once shut down) and its CUDA device (-1 before its
// first CUDA op, which the Python path makes).
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PyProcessGroup.hpp>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <array>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

extern "C" {
#include "gosym.h"
// The CUDA runtime's capture query (torch's wheel brings the runtime; its headers may be
// absent): cudaStreamCaptureStatusNone is 0.
int cudaStreamIsCapturing(void* stream, int* status);
}

namespace py = pybind11;

namespace gosym {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;

// CUDA through c10's device interface: streams, events and the caching allocator's record
// without CUDA's headers.
const c10::impl::DeviceGuardImplInterface* cuda() {
  static const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return impl;
}

c10::Stream currentStream(int idx) {
  return cuda()->getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(idx)));
}

// Events of finished CudaWorks, per device, for the next ops' ends (as ProcessGroupNCCL's
// event cache and gosym.work.cuda's): no event created and destroyed per asynchronous op.
class EventPool {
 public:
  static c10::Event take(c10::DeviceIndex idx) {
    std::lock_guard<std::mutex> lock(mu());
    auto& pool = pools()[idx];
    if (pool.empty()) {
      return c10::Event(c10::DeviceType::CUDA);
    }
    c10::Event ev = std::move(pool.back());
    pool.pop_back();
    return ev;
  }
  static void give(c10::DeviceIndex idx, c10::Event&& ev) {
    std::lock_guard<std::mutex> lock(mu());
    auto& pool = pools()[idx];
    if (pool.size() < 256) {
      pool.push_back(std::move(ev));
    }
  }

 private:
  // Never destroyed: CUDA may be gone when static destructors run.
  static std::mutex& mu() {
    static auto* m = new std::mutex();
    return *m;
  }
  static std::unordered_map<int, std::vector<c10::Event>>& pools() {
    static auto* p = new std::unordered_map<int, std::vector<c10::Event>>();
    return *p;
  }
};

// A future holding out, completed for whoever follows stream (a CUDA-aware future where out
// is on a GPU, as ProcessGroupNCCL's).
c10::intrusive_ptr<c10::ivalue::Future> completed(const std::vector<at::Tensor>& out,
                                                  std::optional<c10::Stream> stream) {
  std::vector<c10::Device> devices;
  if (stream) {
    devices.push_back(stream->device());
  }
  auto fut = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), devices);
  std::optional<c10::StreamGuard> guard;
  if (stream) {
    guard.emplace(*stream);
  }
  fut->markCompleted(c10::IValue(out));
  return fut;
}

// The engine's entry points this module calls.
struct Api {
  int32_t (*op_run)(uint64_t, const gosym_op_desc*) = nullptr;
  int32_t (*device_error)(uint64_t) = nullptr;
};

// The engine's error st as the Python package raises it: _lib.error builds it (its class and
// text), here, on the failing thread, which holds the engine's last error.
[[noreturn]] void raise(int32_t st) {
  py::gil_scoped_acquire gil;
  py::object e = py::module_::import("gosym._lib").attr("error")(st);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
  throw py::error_already_set();
}

class Group;

// The ScalarType index of a torch.dtype handed in from Python (what the dtype tables are
// indexed by).
size_t scalarIndex(const py::object& dtype, const char* what) {
  TORCH_CHECK_TYPE(THPDtype_Check(dtype.ptr()), "gosym: ", what, " takes torch.dtype");
  return static_cast<size_t>(reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type);
}

// Lets go of a Python object from C++: with the GIL, or, once the interpreter is going away,
// by leaving it to the exit (taking the GIL then would hang or crash).
void dropPython(py::object& o) {
#if PY_VERSION_HEX >= 0x030D0000
  bool finalizing = Py_IsFinalizing();
#else
  bool finalizing = _Py_IsFinalizing();
#endif
  if (Py_IsInitialized() && !finalizing) {
    py::gil_scoped_acquire gil;
    o = py::object();
  } else {
    o.release();
  }
}

// A Work of the Python group, as torch's C++ group hands it back: every question goes to the
// Python object, which this keeps alive (torch's PyWorkHolder forwards only wait and the
// future: is_completed, result and a receive's source rank would be the base class's).
class PyWork : public Work {
 public:
  explicit PyWork(py::object w) : work_(w.cast<c10::intrusive_ptr<Work>>()), obj_(std::move(w)) {}
  ~PyWork() override {
    dropPython(obj_);
  }
  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return obj_.attr("is_completed")().cast<bool>();
  }
  bool isSuccess() const override {
    py::gil_scoped_acquire gil;
    return obj_.attr("is_success")().cast<bool>();
  }
  std::exception_ptr exception() const override {
    py::gil_scoped_acquire gil;
    py::object e = obj_.attr("exception")();
    if (e.is_none()) {
      return nullptr;
    }
    return std::make_exception_ptr(std::runtime_error(py::str(e).cast<std::string>()));
  }
  int sourceRank() const override {
    py::gil_scoped_acquire gil;
    return obj_.attr("_source_rank")().cast<int>();
  }
  std::vector<at::Tensor> result() override {
    py::gil_scoped_acquire gil;
    return obj_.attr("result")().cast<std::vector<at::Tensor>>();
  }
  void synchronize() override {
    py::gil_scoped_acquire gil;
    obj_.attr("synchronize")();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    return work_->wait(timeout);  // torch's trampoline: the Python wait(), with the GIL
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return work_->getFuture();  // torch's trampoline: the Python get_future()
  }

 private:
  c10::intrusive_ptr<Work> work_;
  py::object obj_;
};

// A Work of the short path: its outputs, and a future completed for whoever follows the op's
// stream (none for a host op).
class ShortWork : public Work {
 public:
  ShortWork(std::vector<at::Tensor> out, std::optional<c10::Stream> stream)
      : out_(std::move(out)), stream_(stream) {}
  bool isSuccess() const override {
    return true;
  }
  std::vector<at::Tensor> result() override {
    return out_;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return completed(out_, stream_);
  }

 protected:
  std::vector<at::Tensor> out_;
  std::optional<c10::Stream> stream_;
};

// The Work of a synchronous caller: nothing left to wait for (a CUDA op is on the caller's
// stream, a host op returned done), as the Python group's None.
class DoneWork : public ShortWork {
 public:
  using ShortWork::ShortWork;
  bool isCompleted() override {
    return true;
  }
  bool wait(std::chrono::milliseconds) override {
    return true;
  }
};

// The Work of an asynchronous CUDA op of the short path: gosym.work.cuda.CudaWork in C++
// (enqueued on the caller's stream before it exists; wait() joins its end into the current
// stream where they differ and raises the group's device error, as ProcessGroupNCCL's).
class CudaWork : public ShortWork {
 public:
  CudaWork(std::vector<at::Tensor> out, c10::Stream stream, bool end,
           c10::intrusive_ptr<Group> group);
  ~CudaWork() override {
    if (end_) {
      EventPool::give(stream_->device_index(), std::move(*end_));
    }
  }
  bool isCompleted() override {
    return !end_ || end_->query();
  }
  bool wait(std::chrono::milliseconds) override;
  void synchronize() override {
    wait(std::chrono::milliseconds(0));
  }

 private:
  std::optional<c10::Event> end_;
  c10::intrusive_ptr<Group> group_;
};

class Group : public c10d::Backend {
 public:
  Group(py::object group, int rank, int size, uintptr_t shared, uintptr_t op_run,
        uintptr_t device_error,
        const std::vector<std::pair<py::object, int64_t>>& dtypes,
        const std::vector<std::pair<int64_t, int64_t>>& reds, double timeout_s)
      : c10d::Backend(rank, size),
        group_(std::move(group)),
        shared_(reinterpret_cast<const int64_t*>(shared)),
        timeout_(static_cast<int64_t>(timeout_s * 1000)) {
    api_.op_run = reinterpret_cast<decltype(api_.op_run)>(op_run);
    api_.device_error = reinterpret_cast<decltype(api_.device_error)>(device_error);
    codes_.fill(-1);
    for (const auto& [dtype, code] : dtypes) {
      auto k = scalarIndex(dtype, "dtypes");
      if (k < codes_.size()) {
        codes_[k] = static_cast<int8_t>(code);
      }
    }
    reds_.fill(-1);
    for (const auto& [op, code] : reds) {
      if (op >= 0 && op < static_cast<int64_t>(reds_.size())) {
        reds_[op] = static_cast<int8_t>(code);
      }
    }
  }

  ~Group() override {
    dropPython(group_);
  }

  const py::object& group() const {
    return group_;
  }

  const std::string getBackendName() const override {
    return "gosym";
  }

  // ---- the short path ----------------------------------------------------------------

  // The Python group's device error for a Work's wait(): one load of host memory.
  void checkDeviceError() const {
    uint64_t h = static_cast<uint64_t>(shared_[0]);
    if (h == 0) {
      return;
    }
    int32_t st = api_.device_error(h);
    if (st) {
      raise(st);
    }
  }

  // ---- ops ---------------------------------------------------------------------------

  WorkPtr allreduce(std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& o) override {
    if (ts.size() == 1) {
      int red = plainRed(o.reduceOp);
      if (red >= 0) {
        if (auto w = inPlace(GOSYM_OP_ALLREDUCE, ts, red, 0, o.asyncOp)) {
          return w;
        }
      }
    }
    return call("allreduce", ts, o);
  }

  WorkPtr reduce(std::vector<at::Tensor>& ts, const c10d::ReduceOptions& o) override {
    if (ts.size() == 1 && o.rootRank >= 0 && o.rootRank < size_) {
      int red = plainRed(o.reduceOp);
      if (red >= 0) {
        if (auto w = inPlace(GOSYM_OP_REDUCE, ts, red, o.rootRank, o.asyncOp)) {
          return w;
        }
      }
    }
    return call("reduce", ts, o);
  }

  WorkPtr broadcast(std::vector<at::Tensor>& ts, const c10d::BroadcastOptions& o) override {
    if (ts.size() == 1 && o.rootRank >= 0 && o.rootRank < size_) {
      if (auto w = inPlace(GOSYM_OP_BROADCAST, ts, 0, o.rootRank, o.asyncOp)) {
        return w;
      }
    }
    return call("broadcast", ts, o);
  }

  WorkPtr _allgather_base(at::Tensor& out, at::Tensor& in,
                          const c10d::AllgatherOptions& o) override {
    if (out.numel() == in.numel() * size_) {
      if (auto w = pair(GOSYM_OP_ALLGATHER, out, in, in.numel(), 0, o.asyncOp)) {
        return w;
      }
    }
    return call("_allgather_base", out, in, o);
  }

  WorkPtr _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                               const c10d::ReduceScatterOptions& o) override {
    int red = plainRed(o.reduceOp);
    if (red >= 0 && in.numel() == out.numel() * size_) {
      if (auto w = pair(GOSYM_OP_REDUCE_SCATTER, out, in, out.numel(), red, o.asyncOp)) {
        return w;
      }
    }
    return call("_reduce_scatter_base", out, in, o);
  }

  WorkPtr alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& outSplits,
                        std::vector<int64_t>& inSplits,
                        const c10d::AllToAllOptions& o) override {
    if (outSplits.empty() && inSplits.empty()) {
      if (in.dim() > 0 && out.dim() > 0 && in.size(0) % size_ == 0 && out.size(0) % size_ == 0 &&
          out.numel() == in.numel()) {
        if (auto w = pair(GOSYM_OP_ALLTOALL, out, in, in.numel() / size_, 0, o.asyncOp)) {
          return w;
        }
      }
    } else {
      // Splits (MoE's dispatch): the pieces built here, valid ones only (the Python path
      // raises on the others, naming what is wrong)
      int idx = pairWhere(out, in, o.asyncOp);
      std::vector<gosym_piece> ip, op;
      if (idx != -2 && pieces(in, inSplits, ip) && pieces(out, outSplits, op)) {
        gosym_op_desc d = desc(GOSYM_OP_ALLTOALL, code(in), 0);
        d.in_pieces = ip.data();
        d.out_pieces = op.data();
        d.n_in = d.n_out = size_;
        return run(d, idx, {in, out}, {out}, o.asyncOp);
      }
    }
    return call("alltoall_base", out, in, outSplits, inSplits, o);
  }

  // ---- everything else: the Python group's method -------------------------------------

  WorkPtr allreduce_sparse(std::vector<at::Tensor>& ts,
                           const c10d::AllreduceOptions& o) override {
    return call("allreduce", ts, o);
  }
  WorkPtr allreduce_coalesced(std::vector<at::Tensor>& ts,
                              const c10d::AllreduceCoalescedOptions& o) override {
    return call("allreduce_coalesced", ts, o);
  }
  WorkPtr allgather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                    const c10d::AllgatherOptions& o) override {
    return call("allgather", outs, ins, o);
  }
  WorkPtr allgather_coalesced(std::vector<std::vector<at::Tensor>>& outs,
                              std::vector<at::Tensor>& ins,
                              const c10d::AllgatherOptions& o) override {
    return call("allgather_coalesced", outs, ins, o);
  }
  WorkPtr allgather_into_tensor_coalesced(std::vector<at::Tensor>& outs,
                                          std::vector<at::Tensor>& ins,
                                          const c10d::AllgatherOptions& o) override {
    return call("allgather_into_tensor_coalesced", outs, ins, o);
  }
  WorkPtr gather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                 const c10d::GatherOptions& o) override {
    return call("gather", outs, ins, o);
  }
  WorkPtr scatter(std::vector<at::Tensor>& outs, std::vector<std::vector<at::Tensor>>& ins,
                  const c10d::ScatterOptions& o) override {
    return call("scatter", outs, ins, o);
  }
  WorkPtr reduce_scatter(std::vector<at::Tensor>& outs,
                         std::vector<std::vector<at::Tensor>>& ins,
                         const c10d::ReduceScatterOptions& o) override {
    return call("reduce_scatter", outs, ins, o);
  }
  WorkPtr reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outs,
                                          std::vector<at::Tensor>& ins,
                                          const c10d::ReduceScatterOptions& o) override {
    return call("reduce_scatter_tensor_coalesced", outs, ins, o);
  }
  WorkPtr alltoall(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                   const c10d::AllToAllOptions& o) override {
    return call("alltoall", outs, ins, o);
  }
  WorkPtr send(std::vector<at::Tensor>& ts, int dst, int tag) override {
    return call("send", ts, dst, tag);
  }
  WorkPtr recv(std::vector<at::Tensor>& ts, int src, int tag) override {
    return call("recv", ts, src, tag);
  }
  WorkPtr recvAnysource(std::vector<at::Tensor>& ts, int tag) override {
    return call("recv_anysource", ts, tag);
  }
  WorkPtr barrier(const c10d::BarrierOptions& o) override {
    return call("barrier", o);
  }
  // torch's batch_isend_irecv coalesces a batch only where the backend says it can; the
  // Python group says whether it does (a group across hosts: gosym.hier.group.HierGroup's
  // batches make their first contacts across hosts before posting any op).
  bool supportsCoalescing() const override {
    py::gil_scoped_acquire gil;
    return group_.attr("supports_coalescing").cast<bool>();
  }
  // (a group that does not: torch's own refusal, naming the backend)
  void startCoalescing() override {
    if (!supportsCoalescing()) {
      c10d::Backend::startCoalescing();
    }
    py::gil_scoped_acquire gil;
    group_.attr("start_coalescing")();
  }
  WorkPtr endCoalescing() override {
    if (!supportsCoalescing()) {
      return c10d::Backend::endCoalescing();
    }
    return call("end_coalescing");
  }
  void monitoredBarrier(const c10d::BarrierOptions& o, bool waitAll) override {
    py::gil_scoped_acquire gil;
    // torch's unset timeout (negative) is the group's, as the Python method's None
    py::object t = o.timeout.count() < 0 ? py::none() : py::cast(o.timeout);
    group_.attr("monitored_barrier")(t, waitAll);
  }

  // ---- lifetime, splitting, memory ----------------------------------------------------

  void shutdown() override {
    py::gil_scoped_acquire gil;
    group_.attr("shutdown")();
  }
  void abort() override {
    py::gil_scoped_acquire gil;
    group_.attr("abort")();
  }
  void setSequenceNumberForGroup() override {}  // sequence numbers are the engine's
  uint64_t getSequenceNumberForGroup() override {
    return 0;
  }
  void eagerConnectSingleDevice(at::Device) override {}  // connected at creation
  bool supportsSplitting() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override {
    return c10::make_intrusive<c10d::Backend::Options>("gosym", timeout_);
  }
  // ProcessGroup::splitGroup asks each device's backend, and this one serves both: the
  // second call of one split gets the child the first made (gosym.split counts splits).
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>&,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  bool supportsTensorAlloc(c10::DeviceIndex idx) override {
    if (idx < 0) {
      return false;  // torch passes a device's index alone: a host device has none
    }
    py::gil_scoped_acquire gil;
    return group_.attr("supports_tensor_alloc")(c10::Device(c10::DeviceType::CUDA, idx))
        .cast<bool>();
  }
  at::Tensor allocateTensor(long size, at::TensorOptions opts) override {
    py::gil_scoped_acquire gil;
    py::object dtype = py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(opts.dtype().toScalarType())));
    return group_.attr("allocate_tensor")(size, py::arg("dtype") = dtype,
                                          py::arg("device") = opts.device())
        .cast<at::Tensor>();
  }

 protected:
  // GOSYM_RED_* of a reduce op without a factor, else -1 (the Python path takes it).
  int plainRed(const c10d::ReduceOp& op) const {
    auto k = static_cast<size_t>(op.op_);
    return k < reds_.size() ? reds_[k] : -1;
  }

  int code(const at::Tensor& t) const {
    auto k = static_cast<size_t>(t.scalar_type());
    return k < codes_.size() ? codes_[k] : -1;
  }

  // The CUDA device a dense tensor of this group takes the short path on; -1: a host tensor
  // with a synchronous caller; -2: the Python path.
  int where(const at::Tensor& t, bool asyncOp) const {
    if (t.layout() != c10::kStrided || !t.is_contiguous()) {
      return -2;
    }
    if (t.is_cuda()) {
      int idx = t.get_device();
      return idx == shared_[1] ? idx : -2;
    }
    return t.is_cpu() && !asyncOp ? -1 : -2;
  }

  bool fast() const {
    return shared_[0] != 0 && !torch::profiler::impl::profilerEnabled();
  }

  WorkPtr run(gosym_op_desc& d, int idx, std::vector<at::Tensor> keep,
              std::vector<at::Tensor> out, bool asyncOp) {
    d.struct_size = sizeof(gosym_op_desc);
    if (idx < 0) {
      d.device = -1;
      int32_t st = api_.op_run(static_cast<uint64_t>(shared_[0]), &d);
      if (st) {
        raise(st);
      }
      return c10::make_intrusive<DoneWork>(std::move(out), std::nullopt);
    }
    c10::Stream stream = currentStream(idx);
    void* raw = stream.native_handle();
    d.stream = reinterpret_cast<uint64_t>(raw);
    d.device = idx;
    int32_t st = api_.op_run(static_cast<uint64_t>(shared_[0]), &d);
    if (st) {
      raise(st);
    }
    // As the Python path's record_stream: no buffer is reused before the op ran.
    for (auto& t : keep) {
      cuda()->recordDataPtrOnStream(t.storage().data_ptr(), stream);
    }
    if (!asyncOp) {
      return c10::make_intrusive<DoneWork>(std::move(out), stream);
    }
    int cap = 0;
    bool end = cudaStreamIsCapturing(raw, &cap) == 0 && cap == 0;
    return c10::make_intrusive<CudaWork>(std::move(out), stream, end,
                                         c10::intrusive_ptr<Group>::reclaim_copy(this));
  }

  static gosym_op_desc desc(int op, int dtype, int red) {
    gosym_op_desc d{};
    d.op = op;
    d.dtype = dtype;
    d.red_op = red;
    d.scale = 1.0;
    return d;
  }

  WorkPtr inPlace(int op, std::vector<at::Tensor>& ts, int red, int root, bool asyncOp) {
    const at::Tensor& t = ts[0];
    int c = code(t);
    int idx = where(t, asyncOp);
    if (c < 0 || idx == -2 || !fast()) {
      return WorkPtr();
    }
    gosym_op_desc d = desc(op, c, red);
    d.root = root;
    d.count = static_cast<uint64_t>(t.numel());
    d.in_addr = d.out_addr = reinterpret_cast<uint64_t>(t.data_ptr());
    return run(d, idx, {t}, ts, asyncOp);
  }

  // Where a pair of one dtype the engine knows takes the short path (as where()), else -2.
  int pairWhere(const at::Tensor& out, const at::Tensor& in, bool asyncOp) const {
    int idx = where(in, asyncOp);
    if (code(in) < 0 || idx == -2 || out.scalar_type() != in.scalar_type() ||
        where(out, asyncOp) != idx || !fast()) {
      return -2;
    }
    return idx;
  }

  WorkPtr pair(int op, at::Tensor& out, at::Tensor& in, int64_t count, int red, bool asyncOp) {
    int idx = pairWhere(out, in, asyncOp);
    if (idx == -2) {
      return WorkPtr();
    }
    gosym_op_desc d = desc(op, code(in), red);
    d.count = static_cast<uint64_t>(count);
    d.in_addr = reinterpret_cast<uint64_t>(in.data_ptr());
    d.out_addr = reinterpret_cast<uint64_t>(out.data_ptr());
    return run(d, idx, {in, out}, {out}, asyncOp);
  }

  // all_to_all_single's pieces of t along dim 0, one per rank: splits rows each (equal
  // when empty), as the Python group's _a2a_pieces; false where they are not valid.
  bool pieces(const at::Tensor& t, const std::vector<int64_t>& splits,
              std::vector<gosym_piece>& out) const {
    int64_t rows = t.dim() ? t.size(0) : 1;
    int64_t row = 1;  // elements per row
    for (int64_t k = 1; k < t.dim(); ++k) {
      row *= t.size(k);
    }
    std::vector<int64_t> even;
    const std::vector<int64_t>* s = &splits;
    if (splits.empty()) {
      if (rows % size_) {
        return false;
      }
      even.assign(size_, rows / size_);
      s = &even;
    }
    if (static_cast<int64_t>(s->size()) != size_) {
      return false;
    }
    int64_t sum = 0;
    for (int64_t r : *s) {
      if (r < 0 || r > rows) {
        return false;
      }
      sum += r;
    }
    if (sum != rows) {
      return false;
    }
    uint64_t addr = reinterpret_cast<uint64_t>(t.data_ptr());
    const uint64_t bytes = static_cast<uint64_t>(row) * t.element_size();
    out.reserve(size_);
    for (int64_t r : *s) {
      out.push_back(gosym_piece{addr, static_cast<uint64_t>(r * row)});
      addr += static_cast<uint64_t>(r) * bytes;
    }
    return true;
  }

  // The Python group's method name, with the GIL; its None (a synchronous caller's) becomes a
  // done Work, since torch's C++ group hands a Work back.
  template <typename... A>
  WorkPtr call(const char* name, A&... args) {
    py::gil_scoped_acquire gil;
    py::object r = group_.attr(name)(args...);
    if (r.is_none()) {
      return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{}, std::nullopt);
    }
    return c10::make_intrusive<PyWork>(std::move(r));
  }

  py::object group_;
  const int64_t* shared_;
  std::chrono::milliseconds timeout_;
  Api api_;
  std::array<int8_t, 64> codes_{};
  std::array<int8_t, 32> reds_{};
  std::mutex split_mu_;
  std::string split_name_;  // the split whose child waits for the second device's question
  c10::intrusive_ptr<c10d::Backend> split_backend_;

 public:
  // gosym.c10d.wrap, for split()'s children: set once, when gosym.c10d loads this module.
  static py::object& wrapper() {
    static py::object* w = new py::object();  // never destroyed: outlives the interpreter
    return *w;
  }
};

// A group across hosts (gosym.hier.HierGroup). The ops its Python group would run flat (the
// inter-host engine's own op on the flat group of every rank: HierAlgorithms._flat_now) go
// to the flat group's backend from here, without Python, where the Python group's choice
// (gosym.hier.schedule.choose) would send them there: CUDA tensors to the flat NCCL group,
// host tensors of a synchronous op to the flat Gloo group (waited for here, as the Python
// path waits); everything else goes to the Python group. The Python group shares its cells
// (HierBase._cells): whether the flat path is open (not broken, no news from the watch, not
// shut down, not TORCH_DISTRIBUTED_DEBUG=DETAIL), its worker's pending ops, its op sequence
// number, its CUDA device, and what took the flat path here, per op.
class Hier : public Group {
 public:
  enum Cell { kOpen, kPending, kSeq, kDevice, kCounts };
  enum Op { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kOps };
  // where an op's tensors are, as the choice's steps are indexed: the flat group of that kind
  enum Place { kCuda, kHost, kPlaces };

  Hier(py::object group, int rank, int size, uintptr_t shared, uintptr_t op_run,
       uintptr_t device_error, const std::vector<std::pair<py::object, int64_t>>& dtypes,
       const std::vector<std::pair<int64_t, int64_t>>& reds, double timeout_s, uintptr_t cells,
       const std::vector<py::object>& wire, std::vector<std::vector<std::pair<int64_t, bool>>> steps,
       int64_t a2a_blocks_max)
      : Group(std::move(group), rank, size, shared, op_run, device_error, dtypes, reds, timeout_s),
        cells_(reinterpret_cast<int64_t*>(cells)),
        steps_(std::move(steps)),
        a2a_blocks_max_(a2a_blocks_max) {
    TORCH_CHECK(steps_.size() == kPlaces * kOps, "gosym: Hier takes the choice's steps of ",
                kOps, " ops on CUDA, then on the host");
    wire_.fill(false);
    for (const auto& d : wire) {
      auto k = scalarIndex(d, "wire");
      if (k < wire_.size()) {
        wire_[k] = true;
      }
    }
  }

  // The choice for op of nbytes on place's tensors, as schedule.choose makes it from the same
  // points: the point at the largest size <= nbytes (the first one below them all); no
  // points: flat.
  bool flatChoice(int place, int op, int64_t nbytes) const {
    const auto& pts = steps_.at(place * kOps + op);
    if (pts.empty()) {
      return true;
    }
    bool flat = pts.front().second;
    for (const auto& [at, f] : pts) {
      if (at <= nbytes) {
        flat = f;
      }
    }
    return flat;
  }

  WorkPtr allreduce(std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& o) override {
    int p = ts.size() == 1 ? placeOf(ts[0], o.asyncOp) : -1;
    if (p >= 0 && plainFlat(p, o.reduceOp) && flatChoice(p, kAllReduce, bytes(ts[0]))) {
      return flat(p, kAllReduce, true, "all_reduce", ts[0],
                  [&](Backend& b) { return b.allreduce(ts, o); });
    }
    return Group::allreduce(ts, o);
  }

  WorkPtr broadcast(std::vector<at::Tensor>& ts, const c10d::BroadcastOptions& o) override {
    int p = ts.size() == 1 && o.rootRank >= 0 && o.rootRank < size_ ? placeOf(ts[0], o.asyncOp)
                                                                     : -1;
    if (p >= 0 && flatChoice(p, kBroadcast, bytes(ts[0]))) {
      return flat(p, kBroadcast, true, "broadcast", ts[0],
                  [&](Backend& b) { return b.broadcast(ts, o); });
    }
    return Group::broadcast(ts, o);
  }

  WorkPtr _allgather_base(at::Tensor& out, at::Tensor& in,
                          const c10d::AllgatherOptions& o) override {
    int p = out.numel() == in.numel() * size_ ? pairPlace(out, in, o.asyncOp) : -1;
    if (p >= 0 && flatChoice(p, kAllGather, bytes(in))) {
      return flat(p, kAllGather, true, "all_gather_into_tensor", out, [&](Backend& b) {
        return asFlat(p, out, in, [&](at::Tensor& fo, at::Tensor& fi) {
          return b._allgather_base(fo, fi, o);
        });
      });
    }
    return Group::_allgather_base(out, in, o);
  }

  WorkPtr _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                               const c10d::ReduceScatterOptions& o) override {
    int p = in.numel() == out.numel() * size_ ? pairPlace(out, in, o.asyncOp) : -1;
    if (p >= 0 && plainFlat(p, o.reduceOp) && flatChoice(p, kReduceScatter, bytes(in))) {
      return flat(p, kReduceScatter, true, "reduce_scatter_tensor", out, [&](Backend& b) {
        return asFlat(p, out, in, [&](at::Tensor& fo, at::Tensor& fi) {
          return b._reduce_scatter_base(fo, fi, o);
        });
      });
    }
    return Group::_reduce_scatter_base(out, in, o);
  }

  // all_to_all_single asks the choice only where its host-blocks schedule applies (host
  // tensors, no split sizes on any rank, the group's hosts laid out for it, at most
  // a2a_blocks_max_ bytes: HierAlgorithms._a2a_applies); elsewhere it runs flat, not counted
  // as chosen.
  WorkPtr alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& outSplits,
                        std::vector<int64_t>& inSplits,
                        const c10d::AllToAllOptions& o) override {
    int p = splits(in, inSplits) && splits(out, outSplits) ? pairPlace(out, in, o.asyncOp) : -1;
    if (p >= 0) {
      bool blocks = p == kHost && bytes(in) <= a2a_blocks_max_ && !given(inSplits) &&
                    !given(outSplits);
      if (!blocks || flatChoice(p, kAllToAll, bytes(in))) {
        return flat(p, kAllToAll, blocks, "all_to_all_single", out, [&](Backend& b) {
          return b.alltoall_base(out, in, outSplits, inSplits, o);
        });
      }
    }
    return Group::alltoall_base(out, in, outSplits, inSplits, o);
  }

 private:
  using Backend = c10d::Backend;

  static int64_t bytes(const at::Tensor& t) {
    return t.numel() * static_cast<int64_t>(t.element_size());
  }

  // A two-buffer op's pair as the flat group takes it: NCCL the tensors themselves; Gloo, whose
  // two-buffer ops split the output along dim 0 (as torch.chunk), 1-D views, as the Python
  // flat path hands them.
  template <typename F>
  static WorkPtr asFlat(int place, at::Tensor& out, at::Tensor& in, F&& call) {
    if (place == kCuda) {
      return call(out, in);
    }
    at::Tensor fo = out.view(-1), fi = in.view(-1);
    return call(fo, fi);
  }

  static bool given(const std::vector<int64_t>& s) {
    for (int64_t r : s) {
      if (r) {
        return true;
      }
    }
    return false;
  }

  // A reduction the flat group runs as the caller gave it: no factor, no bitwise op (those
  // take the Python path, which refuses the bitwise ones on CUDA tensors); Gloo has no AVG.
  static bool plainFlat(int place, const c10d::ReduceOp& op) {
    return op.op_ <= c10d::ReduceOp::MAX && (place == kCuda || op.op_ != c10d::ReduceOp::AVG);
  }

  // Whether an op may take the flat path here: it is open, nothing is pending before the op,
  // and no profiler runs (the Python path records the op's range).
  bool open() const {
    return __atomic_load_n(&cells_[kOpen], __ATOMIC_ACQUIRE) == 1 &&
           __atomic_load_n(&cells_[kPending], __ATOMIC_ACQUIRE) == 0 &&
           !torch::profiler::impl::profilerEnabled();
  }

  // Where a tensor the Python flat path takes is (-1: not one): dense, contiguous, non-empty,
  // of a dtype the inter-host engines move as themselves, on the group's CUDA device, or on
  // the host for a synchronous op (an asynchronous one's Work is the Python group's).
  int where(const at::Tensor& t, bool asyncOp) const {
    auto k = static_cast<size_t>(t.scalar_type());
    if (t.layout() != c10::kStrided || t.numel() == 0 || !t.is_contiguous() ||
        k >= wire_.size() || !wire_[k]) {
      return -1;
    }
    if (t.is_cuda()) {
      return t.get_device() == cells_[kDevice] ? kCuda : -1;
    }
    return t.is_cpu() && !asyncOp ? kHost : -1;
  }

  // An op's place on the flat path, -1 where it does not take it; open() asked once an op.
  int placeOf(const at::Tensor& t, bool asyncOp) const {
    int p = where(t, asyncOp);
    return p >= 0 && open() ? p : -1;
  }

  int pairPlace(const at::Tensor& out, const at::Tensor& in, bool asyncOp) const {
    if (out.scalar_type() != in.scalar_type()) {
      return -1;
    }
    int p = where(out, asyncOp);
    return p >= 0 && where(in, asyncOp) == p && open() ? p : -1;
  }

  // splits that split t's dim 0 among the ranks (empty: evenly), as the Python group checks
  bool splits(const at::Tensor& t, const std::vector<int64_t>& s) const {
    int64_t rows = t.dim() ? t.size(0) : 1;
    if (s.empty()) {
      return rows % size_ == 0;
    }
    if (static_cast<int64_t>(s.size()) != size_) {
      return false;
    }
    int64_t sum = 0;
    for (int64_t r : s) {
      if (r < 0) {
        return false;
      }
      sum += r;
    }
    return sum == rows;
  }

  // The flat group's backend for place (NCCL, Gloo), asked of the Python group once.
  Backend& flatGroup(int place) {
    std::call_once(flat_once_[place], [this, place] {
      py::gil_scoped_acquire gil;
      flat_[place] = group_.attr("_group")("flat", place == kCuda ? "cuda" : "cpu")
                         .cast<c10::intrusive_ptr<Backend>>();
    });
    return *flat_[place];
  }

  // The op issued on the flat group, numbered as the Python flat path does and counted
  // where the choice made it (chosen); a host op is waited for (its Work done, holding its
  // output keep, as the Python path's None). A failure is the group's (HierGroup._failed
  // names lost ranks), raised by the Python group.
  template <typename F>
  WorkPtr flat(int place, int op, bool chosen, const char* what, const at::Tensor& keep,
               F&& issue) {
    int64_t seq = __atomic_add_fetch(&cells_[kSeq], 1, __ATOMIC_RELAXED);
    if (chosen) {
      __atomic_add_fetch(&cells_[kCounts + op], 1, __ATOMIC_RELAXED);
    }
    std::string why, kind;
    try {
      WorkPtr w = issue(flatGroup(place));
      if (place == kCuda) {
        return w;
      }
      waitHost(*w, what, seq, keep);
      return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{keep}, std::nullopt);
    } catch (const py::error_already_set&) {
      throw;
    } catch (const c10::Error& e) {
      why = e.what_without_backtrace();
      kind = "DistBackendError";
    } catch (const std::exception& e) {
      why = e.what();
      kind = "RuntimeError";
    }
    py::gil_scoped_acquire gil;
    group_.attr("_flat_failed")(what, seq, keep, kind, why);  // raises
    throw std::logic_error("gosym: _flat_failed returned");
  }

  // A synchronous host op's Gloo Work waited for in slices (HierAlgorithms._wait_flat): a
  // peer that gave up leaves Gloo's op waiting until its own timeout, and no abort of Gloo's
  // ends it, so where the flat path closes meanwhile the Python group raises its failure if
  // the watch's news or an earlier failure closed it (_flat_news). The op's own failure
  // propagates to flat().
  void waitHost(Work& w, const char* what, int64_t seq, const at::Tensor& keep) {
    for (;;) {
      try {
        w.wait(kHostSlice);
        return;
      } catch (const std::exception&) {  // the slice's end ("Operation timed out!"), or a failure
        if (w.isCompleted()) {
          w.wait();
          return;
        }
      }
      if (__atomic_load_n(&cells_[kOpen], __ATOMIC_ACQUIRE) == 0) {
        py::gil_scoped_acquire gil;
        group_.attr("_flat_news")(what, seq, keep);  // raises where the group failed
      }
    }
  }

  static constexpr std::chrono::milliseconds kHostSlice{100};

  int64_t* cells_;
  std::vector<std::vector<std::pair<int64_t, bool>>> steps_;
  std::array<bool, 64> wire_{};
  // HierAlgorithms._a2a_blocks_max: the most bytes of input for which all_to_all_single takes
  // host blocks (0: the hosts' layout takes none)
  int64_t a2a_blocks_max_;
  std::array<std::once_flag, kPlaces> flat_once_;
  std::array<c10::intrusive_ptr<Backend>, kPlaces> flat_;
};

CudaWork::CudaWork(std::vector<at::Tensor> out, c10::Stream stream, bool end,
                   c10::intrusive_ptr<Group> group)
    : ShortWork(std::move(out), stream), group_(std::move(group)) {
  if (end) {
    end_.emplace(EventPool::take(stream.device_index()));
    end_->record(stream);
  }
}

bool CudaWork::wait(std::chrono::milliseconds) {
  const c10::Stream& op = *stream_;
  c10::Stream cur = currentStream(op.device_index());
  if (cur != op) {
    if (end_) {
      end_->block(cur);
    } else {
      c10::Event ev(c10::DeviceType::CUDA);
      ev.record(op);
      ev.block(cur);
    }
  }
  group_->checkDeviceError();
  return true;
}

c10::intrusive_ptr<c10d::Backend> Group::split(const c10::intrusive_ptr<c10d::Store>&,
                                               const std::vector<int>& ranks,
                                               const c10::intrusive_ptr<Options>& opts) {
  std::lock_guard<std::mutex> lock(split_mu_);
  if (!split_name_.empty() && split_name_ == opts->group_name) {
    split_name_.clear();  // handed once: the parent does not keep its child alive
    return std::exchange(split_backend_, c10::intrusive_ptr<c10d::Backend>());
  }
  py::gil_scoped_acquire gil;
  std::chrono::duration<double> t = opts->timeout;
  py::object child = group_.attr("split_group")(
      ranks, py::module_::import("datetime").attr("timedelta")(py::arg("seconds") = t.count()),
      py::none(), opts->group_name, opts->group_desc);
  c10::intrusive_ptr<c10d::Backend> backend;
  if (!child.is_none()) {
    backend = wrapper()(child).cast<c10::intrusive_ptr<c10d::Backend>>();
  }
  split_name_ = opts->group_name;
  split_backend_ = backend;
  return backend;
}

}  // namespace gosym

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "gosym's c10d::Backend: the short path in C++, the rest in the Python group";
  py::module_::import("torch.distributed");
  py::class_<gosym::Group, c10d::Backend, c10::intrusive_ptr<gosym::Group>>(m, "Group")
      .def(py::init<py::object, int, int, uintptr_t, uintptr_t, uintptr_t,
                    const std::vector<std::pair<py::object, int64_t>>&,
                    const std::vector<std::pair<int64_t, int64_t>>&, double>(),
           py::arg("group"), py::arg("rank"), py::arg("size"), py::arg("shared"),
           py::arg("op_run"), py::arg("device_error"),
           py::arg("dtypes"), py::arg("reds"), py::arg("timeout_s"))
      .def_property_readonly("group", &gosym::Group::group,
                             "the ProcessGroupGosym this backend runs")
      // split_group deep-copies a parent's options: none here, as the Python group's
      .def_property_readonly("options", [](const gosym::Group&) { return py::none(); })
      .def("comm_split_count",
           [](const gosym::Group& g) { return g.group().attr("comm_split_count")(); })
      // new_group on a bound default group asks its backend this on ranks left out (NCCL's
      // ncclCommSplit needs every rank): a gosym rank outside a new group takes no part
      .def("perform_nocolor_split", [](const gosym::Group&, py::object) {});
  py::class_<gosym::Hier, gosym::Group, c10::intrusive_ptr<gosym::Hier>>(m, "Hier")
      .def(py::init<py::object, int, int, uintptr_t, uintptr_t, uintptr_t,
                    const std::vector<std::pair<py::object, int64_t>>&,
                    const std::vector<std::pair<int64_t, int64_t>>&, double, uintptr_t,
                    const std::vector<py::object>&,
                    std::vector<std::vector<std::pair<int64_t, bool>>>, int64_t>(),
           py::arg("group"), py::arg("rank"), py::arg("size"), py::arg("shared"),
           py::arg("op_run"), py::arg("device_error"), py::arg("dtypes"), py::arg("reds"),
           py::arg("timeout_s"), py::arg("cells"), py::arg("wire"), py::arg("steps"),
           py::arg("a2a_blocks_max"))
      .def("flat_choice", &gosym::Hier::flatChoice, py::arg("place"), py::arg("op"),
           py::arg("nbytes"),
           "the choice this backend makes for op (its index in gosym.hier.schedule.FLAT_OPS) "
           "of nbytes on place's tensors (0: CUDA, 1: host): True where it runs flat");
  m.def("set_wrapper", [](py::object f) { gosym::Group::wrapper() = std::move(f); });
}
