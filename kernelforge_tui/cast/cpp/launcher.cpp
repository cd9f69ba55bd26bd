// The compiled launcher of the .cast runtime (kernelforge_tui/cast/launcher.py builds and drives it).
//
// One boxed kernel per overridden aten overload, registered at the same dispatch key as the runtime's Python
// kernel and above it. It holds the decisions the Python guard made, per call signature (every argument on the
// dispatcher's stack: a tensor's sizes, strides, dtype and device; any other argument's tag and value), and replays
// them: a signature the guard admitted allocates its outputs (at::empty_strided) and launches the kernel with
// cuLaunchKernel on torch's current stream, after checking the pointers against the guard's alignment; a signature
// it refused goes to the overload's original kernel. Everything else (a signature not seen yet, a misaligned
// pointer, a launch error) goes to the Python kernel below it, which decides, counts and says why. So the Python
// guard stays the only place that decides; this file only replays. Counters per decision are drained by Python.
//
// The control plane is a handful of ops in the kernelforge_launcher namespace, called from Python. libcuda is
// opened with dlopen at the first launch (never linked), so the library builds against a CPU-only torch; a test
// routes the launch through a function of its own (`hook`).

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

// cuLaunchKernel's signature (cuda.h), with CUfunction and CUstream as the pointers they are.
using LaunchFunction = int (*)(void* function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                               unsigned block_y, unsigned block_z, unsigned shared_bytes, void* stream, void** params,
                               void** extra);

std::atomic<LaunchFunction> launch_function{nullptr};
std::mutex resolve_lock;

// The launch function: the hook's, else libcuda's cuLaunchKernel (looked up once); nullptr where libcuda cannot be
// opened, and then every call takes the Python path.
LaunchFunction driver_launch() {
  LaunchFunction found = launch_function.load(std::memory_order_acquire);
  if (found != nullptr) {
    return found;
  }
  std::lock_guard<std::mutex> guard(resolve_lock);
  found = launch_function.load(std::memory_order_acquire);
  if (found == nullptr) {
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      found = reinterpret_cast<LaunchFunction>(dlsym(library, "cuLaunchKernel"));
      launch_function.store(found, std::memory_order_release);
    }
  }
  return found;
}

// What one argument on the stack must be for a decision to apply.
struct ArgSpec {
  enum Kind : uint8_t { kTensor, kUndefinedTensor, kNone, kBool, kInt, kDouble, kString, kIntList, kDevice };
  Kind kind = kNone;
  std::vector<int64_t> sizes;  // a tensor's sizes, or an int list's values
  std::vector<int64_t> strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device{c10::DeviceType::CPU};
  int64_t bits = 0;  // an int's, bool's or double's bits
  std::string text;

  bool matches(const c10::IValue& value) const {
    switch (kind) {
      case kTensor: {
        if (!value.isTensor()) {
          return false;
        }
        const at::Tensor& t = value.toTensor();
        return t.defined() && t.scalar_type() == dtype && t.device() == device && t.sizes() == c10::IntArrayRef(sizes) &&
               t.strides() == c10::IntArrayRef(strides);
      }
      case kUndefinedTensor:
        return value.isTensor() && !value.toTensor().defined();
      case kNone:
        return value.isNone();
      case kBool:
        return value.isBool() && static_cast<int64_t>(value.toBool()) == bits;
      case kInt:
        return value.isInt() && value.toInt() == bits;
      case kDouble: {
        if (!value.isDouble()) {
          return false;
        }
        double d = value.toDouble();
        int64_t b = 0;
        std::memcpy(&b, &d, sizeof b);
        return b == bits;
      }
      case kString:
        return value.isString() && value.toStringRef() == text;
      case kIntList:
        return value.isIntList() && value.toIntList().vec() == sizes;
      case kDevice:
        return value.isDevice() && value.toDevice() == device;
    }
    return false;
  }
};

inline uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ULL; }

// A hash of what the specs compare (equal stacks hash equal); false where an argument is of a kind not replayed
// (a list of tensors, a Scalar held as a tensor, ...): those calls always go to the Python kernel.
bool hash_stack(const c10::IValue* args, size_t count, uint64_t* out) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < count; ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        h = mix(h, 1);
        continue;
      }
      h = mix(h, static_cast<uint64_t>(t.scalar_type()) + 16);
      for (int64_t s : t.sizes()) {
        h = mix(h, static_cast<uint64_t>(s));
      }
    } else if (v.isInt()) {
      h = mix(h, static_cast<uint64_t>(v.toInt()));
    } else if (v.isBool()) {
      h = mix(h, v.toBool() ? 3 : 2);
    } else if (v.isDouble() || v.isNone() || v.isString() || v.isIntList() || v.isDevice()) {
      h = mix(h, static_cast<uint64_t>(v.tag));
    } else {
      return false;
    }
  }
  *out = h;
  return true;
}

std::vector<ArgSpec> specs_of(const c10::IValue* args, size_t count) {
  std::vector<ArgSpec> specs(count);
  for (size_t i = 0; i < count; ++i) {
    const c10::IValue& v = args[i];
    ArgSpec& s = specs[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        s.kind = ArgSpec::kUndefinedTensor;
        continue;
      }
      s.kind = ArgSpec::kTensor;
      s.sizes = t.sizes().vec();
      s.strides = t.strides().vec();
      s.dtype = t.scalar_type();
      s.device = t.device();
    } else if (v.isNone()) {
      s.kind = ArgSpec::kNone;
    } else if (v.isBool()) {
      s.kind = ArgSpec::kBool;
      s.bits = v.toBool();
    } else if (v.isInt()) {
      s.kind = ArgSpec::kInt;
      s.bits = v.toInt();
    } else if (v.isDouble()) {
      s.kind = ArgSpec::kDouble;
      double d = v.toDouble();
      std::memcpy(&s.bits, &d, sizeof d);
    } else if (v.isString()) {
      s.kind = ArgSpec::kString;
      s.text = v.toStringRef();
    } else if (v.isIntList()) {
      s.kind = ArgSpec::kIntList;
      s.sizes = v.toIntList().vec();
    } else if (v.isDevice()) {
      s.kind = ArgSpec::kDevice;
      s.device = v.toDevice();
    }
  }
  return specs;
}

// A kernel parameter: an input tensor's pointer (by stack position), an output's (by index), or a scalar fixed at
// export (its bits; cuLaunchKernel reads as many bytes as the parameter has, from the low end).
struct Param {
  enum Kind : int64_t { kInput = 0, kOutput = 1, kScalar = 2 };
  int64_t kind;
  int64_t value;
};

struct Output {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  c10::ScalarType dtype;
};

constexpr size_t kMaxParams = 64;

// An output as eager's own CUDA kernels allocate theirs (at::detail::empty_strided_cuda: torch's caching allocator on
// the current device, no dispatcher call), where the tensor's device is the current one; elsewhere through the
// dispatcher (at::empty_strided), which sets the device first: a round trip eager's own kernels do not make.
at::Tensor allocate(const Output& o, c10::Device device) {
  if (device.is_cuda() && c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice() == device) {
    return at::detail::empty_strided_generic(o.sizes, o.strides, c10::GetAllocator(c10::DeviceType::CUDA),
                                             c10::DispatchKeySet(c10::DispatchKey::CUDA), o.dtype);
  }
  return at::empty_strided(o.sizes, o.strides, at::TensorOptions().dtype(o.dtype).device(device));
}

// One decision: a launch plan (the guard admitted the signature) or a refusal (the original kernel runs).
struct Entry {
  uint64_t hash = 0;
  std::vector<ArgSpec> args;
  int64_t slot = 0;
  bool admitted = false;
  void* function = nullptr;
  unsigned launch[7] = {};  // grid x, y, z, block x, y, z, shared bytes
  std::vector<Param> params;
  std::vector<std::pair<int64_t, int64_t>> aligned;  // (stack position, alignment) of every guarded tensor
  std::vector<Output> outputs;
  int64_t device_position = 0;  // the stack position of the tensor whose device the outputs go on
  mutable std::atomic<int64_t> calls{0};

  bool matches(const c10::IValue* stack_args) const {
    for (size_t i = 0; i < args.size(); ++i) {
      if (!args[i].matches(stack_args[i])) {
        return false;
      }
    }
    return true;
  }
};

class Replay;

// The call this thread has handed to the Python kernel because its signature is not in the table: what `admit`
// and `refuse` attach a decision to.
struct Pending {
  Replay* owner;
  uint64_t hash;
  std::vector<ArgSpec> args;
  Pending* outer;
};
thread_local Pending* pending = nullptr;

constexpr size_t kMaxEntries = 256;  // as MAX_DECISIONS in runtime.py

// A kernel the dispatcher computed for a key, as this torch gives it (SafeKernelFunction in 2.9 and later).
using Kernel =
    std::decay_t<decltype(std::declval<c10::OperatorHandle>().getComputedKernelForDispatchKey(c10::DispatchKey::CPU))>;

// One overload's table of decisions and its hot path; it lives across `with` blocks (a decision stays valid), and
// is put in front of the dispatcher by a `Front` per block.
class Replay {
 public:
  Replay(c10::OperatorHandle op, c10::DispatchKey key, Kernel original)
      : op_(std::move(op)), key_(key), original_(std::move(original)), count_(op_.schema().arguments().size()) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keyset, torch::jit::Stack* stack) {
    const c10::IValue* args = stack->data() + stack->size() - count_;
    uint64_t hash = 0;
    if (!hash_stack(args, count_, &hash)) {
      decider_->callBoxed(op, keyset, stack);
      return;
    }
    std::shared_ptr<const Entry> entry = find(hash, args);
    if (entry == nullptr) {
      Pending call{this, hash, specs_of(args, count_), pending};
      pending = &call;
      try {
        decider_->callBoxed(op, keyset, stack);
      } catch (...) {
        pending = call.outer;
        throw;
      }
      pending = call.outer;
      return;
    }
    if (!entry->admitted) {
      entry->calls.fetch_add(1, std::memory_order_relaxed);
      original_.callBoxed(op, keyset, stack);
      return;
    }
    if (!launch(*entry, args, stack)) {
      decider_->callBoxed(op, keyset, stack);  // the Python path: it checks, retries or says why
    }
  }

  // Where the dispatcher calls the Python kernel (registered before this one) for what the table does not hold.
  void set_decider(Kernel decider) { decider_ = std::make_unique<Kernel>(decider); }

  bool record(std::unique_ptr<Entry> entry) {
    Pending* call = pending;
    if (call == nullptr || call->owner != this) {
      return false;  // not a call this kernel handed over (the Python path was called directly)
    }
    call->owner = nullptr;  // one decision per call handed over
    entry->hash = call->hash;
    entry->args = std::move(call->args);
    std::unique_lock<std::shared_mutex> guard(lock_);
    if (size_ >= kMaxEntries) {
      return false;
    }
    uint64_t hash = entry->hash;
    table_.emplace(hash, std::shared_ptr<const Entry>(std::move(entry)));
    ++size_;
    return true;
  }

  // (slot, calls) pairs of the calls replayed since the last drain.
  std::vector<int64_t> drain() {
    std::map<int64_t, int64_t> by_slot;
    {
      std::shared_lock<std::shared_mutex> guard(lock_);
      for (const auto& [hash, entry] : table_) {
        int64_t n = entry->calls.exchange(0, std::memory_order_relaxed);
        if (n != 0) {
          by_slot[entry->slot] += n;
        }
      }
    }
    std::lock_guard<std::mutex> guard(retired_lock_);
    for (const auto& [slot, n] : retired_) {
      by_slot[slot] += n;
    }
    retired_.clear();
    std::vector<int64_t> flat;
    for (const auto& [slot, n] : by_slot) {
      flat.push_back(slot);
      flat.push_back(n);
    }
    return flat;
  }

  // Drop the decisions of one slot (a kernel disabled): its calls go to the Python path again.
  void forget(int64_t slot) {
    std::unique_lock<std::shared_mutex> guard(lock_);
    for (auto it = table_.begin(); it != table_.end();) {
      if (it->second->slot == slot) {
        std::lock_guard<std::mutex> retired_guard(retired_lock_);
        retired_[slot] += it->second->calls.exchange(0, std::memory_order_relaxed);
        it = table_.erase(it);
        --size_;
      } else {
        ++it;
      }
    }
  }

  const c10::OperatorHandle& op() const { return op_; }
  c10::DispatchKey key() const { return key_; }

 private:
  std::shared_ptr<const Entry> find(uint64_t hash, const c10::IValue* args) const {
    std::shared_lock<std::shared_mutex> guard(lock_);
    auto range = table_.equal_range(hash);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second->matches(args)) {
        return it->second;
      }
    }
    return nullptr;
  }

  // Allocate, launch, replace the arguments by the outputs; false (the stack untouched) for the Python path.
  bool launch(const Entry& entry, const c10::IValue* args, torch::jit::Stack* stack) const {
    for (const auto& [position, alignment] : entry.aligned) {
      if (reinterpret_cast<uintptr_t>(args[position].toTensor().data_ptr()) % static_cast<uintptr_t>(alignment)) {
        return false;
      }
    }
    const at::Tensor& on = args[entry.device_position].toTensor();
    c10::SmallVector<at::Tensor, 4> outs;
    for (const Output& o : entry.outputs) {
      outs.push_back(allocate(o, on.device()));
    }
    uint64_t values[kMaxParams];
    void* params[kMaxParams];
    for (size_t i = 0; i < entry.params.size(); ++i) {
      const Param& p = entry.params[i];
      if (p.kind == Param::kInput) {
        values[i] = reinterpret_cast<uintptr_t>(args[p.value].toTensor().data_ptr());
      } else if (p.kind == Param::kOutput) {
        values[i] = reinterpret_cast<uintptr_t>(outs[p.value].data_ptr());
      } else {
        values[i] = static_cast<uint64_t>(p.value);
      }
      params[i] = &values[i];
    }
    void* stream = nullptr;
    if (on.is_cuda()) {
      try {  // the current stream's cudaStream_t (torch 2.11 to 2.13 give it; a torch that does not: the Python path)
        stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(on.device()).native_handle();
      } catch (const c10::Error&) {
        return false;
      }
    }
    LaunchFunction launch_kernel = driver_launch();
    const unsigned* l = entry.launch;
    if (launch_kernel == nullptr ||
        launch_kernel(entry.function, l[0], l[1], l[2], l[3], l[4], l[5], l[6], stream, params, nullptr) != 0) {
      return false;
    }
    entry.calls.fetch_add(1, std::memory_order_relaxed);
    torch::jit::drop(*stack, count_);
    for (at::Tensor& out : outs) {
      stack->emplace_back(std::move(out));
    }
    return true;
  }

  c10::OperatorHandle op_;
  c10::DispatchKey key_;
  Kernel original_;
  std::unique_ptr<Kernel> decider_;
  size_t count_;
  mutable std::shared_mutex lock_;
  std::unordered_multimap<uint64_t, std::shared_ptr<const Entry>> table_;
  size_t size_ = 0;
  std::mutex retired_lock_;
  std::map<int64_t, int64_t> retired_;
};

// The kernel the dispatcher holds while a block is active: it calls the replay, which outlives it.
class Front final : public c10::OperatorKernel {
 public:
  explicit Front(std::shared_ptr<Replay> replay) : replay_(std::move(replay)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keyset, torch::jit::Stack* stack) {
    (*replay_)(op, keyset, stack);
  }

 private:
  std::shared_ptr<Replay> replay_;
};

// A Replay and the registration that puts it in front of the dispatcher (while attached).
struct Registered {
  std::shared_ptr<Replay> replay;
  std::unique_ptr<torch::Library> library;
  std::string impl_name;
};

std::mutex registry_lock;
std::map<int64_t, std::unique_ptr<Registered>> registry;
int64_t next_id = 1;

Registered& registered(int64_t id) {
  auto it = registry.find(id);
  TORCH_CHECK(it != registry.end(), "kernelforge launcher: no replay ", id);
  return *it->second;
}

// Before the Python kernel is registered: the overload's original kernel at `key` is kept.
int64_t create(const std::string& name, const std::string& overload, const std::string& key) {
  c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  c10::DispatchKey dispatch_key = c10::parseDispatchKey(key);
  auto made = std::make_unique<Registered>();
  made->replay = std::make_shared<Replay>(op, dispatch_key, op.getComputedKernelForDispatchKey(dispatch_key));
  std::string bare = name.substr(name.find("::") + 2);
  made->impl_name = overload.empty() ? bare : bare + "." + overload;
  std::lock_guard<std::mutex> guard(registry_lock);
  int64_t id = next_id++;
  registry[id] = std::move(made);
  return id;
}

// After the Python kernel is registered (each `with` block): it becomes the decider, and the replay goes in front.
void attach(int64_t id) {
  std::lock_guard<std::mutex> guard(registry_lock);
  Registered& r = registered(id);
  TORCH_CHECK(r.library == nullptr, "kernelforge launcher: replay ", id, " is attached already");
  const c10::OperatorHandle& op = r.replay->op();
  r.replay->set_decider(op.getComputedKernelForDispatchKey(r.replay->key()));
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", r.replay->key(), __FILE__, __LINE__);
  library->impl(r.impl_name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Front>(r.replay)));
  r.library = std::move(library);
}

// Unregister (the Python kernel is in front again, until it is removed too); the table is kept.
void detach(int64_t id) {
  std::unique_ptr<torch::Library> gone;
  {
    std::lock_guard<std::mutex> guard(registry_lock);
    gone = std::move(registered(id).library);
  }
}

// Detach and free the replay with its table (its Python owner is gone).
void release(int64_t id) {
  std::unique_ptr<Registered> gone;
  {
    std::lock_guard<std::mutex> guard(registry_lock);
    auto it = registry.find(id);
    if (it == registry.end()) {
      return;
    }
    gone = std::move(it->second);
    registry.erase(it);
  }
}

std::shared_ptr<Replay> replay_of(int64_t id) {
  std::lock_guard<std::mutex> guard(registry_lock);
  return registered(id).replay;
}

// The guard admitted the signature of the call this thread is deciding: replay it with this plan.
bool admit(int64_t id, int64_t slot, int64_t function, c10::IntArrayRef launch, c10::IntArrayRef params,
           c10::IntArrayRef aligned, at::TensorList outputs, int64_t device_position) {
  std::shared_ptr<Replay> replay = replay_of(id);
  TORCH_CHECK(launch.size() == 7, "launch: grid x, y, z, block x, y, z, shared bytes");
  TORCH_CHECK(params.size() % 2 == 0 && params.size() / 2 <= kMaxParams, "params: (kind, value) pairs, at most 64");
  TORCH_CHECK(aligned.size() % 2 == 0, "aligned: (position, alignment) pairs");
  if (outputs.size() != replay->op().schema().returns().size()) {
    return false;
  }
  auto entry = std::make_unique<Entry>();
  entry->slot = slot;
  entry->admitted = true;
  entry->function = reinterpret_cast<void*>(static_cast<uintptr_t>(function));
  for (size_t i = 0; i < 7; ++i) {
    entry->launch[i] = static_cast<unsigned>(launch[i]);
  }
  for (size_t i = 0; i < params.size(); i += 2) {
    entry->params.push_back({params[i], params[i + 1]});
  }
  for (size_t i = 0; i < aligned.size(); i += 2) {
    TORCH_CHECK(aligned[i + 1] > 0, "an alignment is a positive number of bytes");
    entry->aligned.emplace_back(aligned[i], aligned[i + 1]);
  }
  for (const at::Tensor& o : outputs) {
    entry->outputs.push_back({o.sizes().vec(), o.strides().vec(), o.scalar_type()});
  }
  entry->device_position = device_position;
  return replay->record(std::move(entry));
}

// The guard refused the signature of the call this thread is deciding: its calls go to the original kernel.
bool refuse(int64_t id, int64_t slot) {
  auto entry = std::make_unique<Entry>();
  entry->slot = slot;
  return replay_of(id)->record(std::move(entry));
}

std::vector<int64_t> drain(int64_t id) { return replay_of(id)->drain(); }

void forget(int64_t id, int64_t slot) { replay_of(id)->forget(slot); }

// The launch function (cuLaunchKernel's signature) at `address`; 0: libcuda's own, looked up at the next launch.
void hook(int64_t address) {
  launch_function.store(reinterpret_cast<LaunchFunction>(static_cast<uintptr_t>(address)), std::memory_order_release);
}

}  // namespace

TORCH_LIBRARY(kernelforge_launcher, m) {
  m.def("create(str name, str overload, str key) -> int", &create);
  m.def("attach(int id) -> ()", &attach);
  m.def("detach(int id) -> ()", &detach);
  m.def("release(int id) -> ()", &release);
  m.def(
      "admit(int id, int slot, int function, int[] launch, int[] params, int[] aligned, Tensor[] outputs, "
      "int device_position) -> bool",
      &admit);
  m.def("refuse(int id, int slot) -> bool", &refuse);
  m.def("drain(int id) -> int[]", &drain);
  m.def("forget(int id, int slot) -> ()", &forget);
  m.def("hook(int address) -> ()", &hook);
}
