// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The Python module `dynamicemb._C`: importing it loads the op library;
// constants() hands the C++ enumerations and layout constants to Python (table,
// admission, embedding, storage and routing), so each is defined once, in C++.
// torch's pybind11 with its Tensor casters; not <torch/extension.h> (tools/lint.sh).
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#include <initializer_list>
#include <utility>

#include "cc/admission/counter.h"
#include "cc/embedding/initializer.h"
#include "cc/embedding/optimizer.h"
#include "cc/ops/storage_args.h"
#include "cc/routing/routing.h"
#include "cc/storage/row_space.h"
#include "cc/table/hash.h"
#include "cc/table/table_ref.h"
#include "cc/table/types.h"

namespace {

namespace tb = dyn_emb::table;
namespace em = dyn_emb::embedding;

/// {name: value} of an enumeration, as Python ints.
template <class E>
py::dict enum_dict(std::initializer_list<std::pair<const char*, E>> members) {
  py::dict d;
  for (const auto& [name, value] : members) d[name] = static_cast<int64_t>(value);
  return d;
}

py::dict constants() {
  using tb::CounterCol;
  using tb::InfoCol;
  py::dict d;
  d["EMPTY_KEY"] = tb::kEmptyKey;
  d["LOCKED_KEY"] = tb::kLockedKey;
  d["FIRST_VALID_KEY"] = tb::kFirstValidKey;
  d["EMPTY_DIGEST"] = static_cast<int>(tb::empty_digest());
  d["BUCKET_ALIGNMENT"] = tb::kBucketAlignment;
  d["MAX_SCORES"] = tb::kMaxScores;
  d["INFO_COLS"] = static_cast<int>(tb::kInfoCols);
  d["COUNTER_COLS"] = static_cast<int>(tb::kCounterCols);
  d["DEBUG_MODULUS"] = em::kDebugModulus;
  d["ScorePolicy"] = enum_dict<tb::ScorePolicy>({{"NONE", tb::ScorePolicy::kNone},
                                                 {"ASSIGN", tb::ScorePolicy::kAssign},
                                                 {"ACCUMULATE", tb::ScorePolicy::kAccumulate},
                                                 {"TIMER", tb::ScorePolicy::kTimer}});
  d["InsertStatus"] = enum_dict<tb::InsertStatus>({{"FOUND", tb::InsertStatus::kFound},
                                                   {"INSERTED", tb::InsertStatus::kInserted},
                                                   {"EVICTED", tb::InsertStatus::kEvicted},
                                                   {"FAILED", tb::InsertStatus::kFailed},
                                                   {"INVALID", tb::InsertStatus::kInvalid},
                                                   {"RELEASED", tb::InsertStatus::kReleased},
                                                   {"REFUSED", tb::InsertStatus::kRefused}});
  d["Admission"] = enum_dict<dyn_emb::admission::Admission>(
      {{"STORED", dyn_emb::admission::Admission::kStored},
       {"ADMITTED", dyn_emb::admission::Admission::kAdmitted},
       {"REJECTED", dyn_emb::admission::Admission::kRejected},
       {"NONE", dyn_emb::admission::Admission::kNone}});
  d["TableMode"] = enum_dict<tb::TableMode>(
      {{"EVICTING", tb::TableMode::kEvicting}, {"NO_EVICTION", tb::TableMode::kNoEviction}});
  d["InfoCol"] = enum_dict<InfoCol>({{"SLOT_OFFSET", tb::kInfoSlotOffset},
                                     {"CAPACITY", tb::kInfoCapacity},
                                     {"BUCKET_CAPACITY", tb::kInfoBucketCapacity},
                                     {"BUCKET_OFFSET", tb::kInfoBucketOffset},
                                     {"ROW_OFFSET", tb::kInfoRowOffset},
                                     {"ROW_CAPACITY", tb::kInfoRowCapacity},
                                     {"MODE", tb::kInfoMode}});
  d["CounterCol"] = enum_dict<CounterCol>({{"SIZE", tb::kCounterSize},
                                           {"INSERT_FAILURES", tb::kCounterInsertFailures},
                                           {"EVICTIONS", tb::kCounterEvictions},
                                           {"NEXT_ROW", tb::kCounterNextRow},
                                           {"FREE_TOP", tb::kCounterFreeTop},
                                           {"INSERTS", tb::kCounterInserts}});
  d["RunOp"] = enum_dict<tb::RunOp>({{"INSERT", tb::RunOp::kInsert},
                                     {"INSERT_EVICT", tb::RunOp::kInsertEvict},
                                     {"ERASE", tb::RunOp::kErase},
                                     {"PLACE", tb::RunOp::kPlace}});
  d["InitMode"] = enum_dict<em::InitMode>({{"NORMAL", em::InitMode::kNormal},
                                           {"TRUNCATED_NORMAL", em::InitMode::kTruncatedNormal},
                                           {"UNIFORM", em::InitMode::kUniform},
                                           {"CONSTANT", em::InitMode::kConstant},
                                           {"DEBUG", em::InitMode::kDebug}});
  d["OptimType"] =
      enum_dict<em::OptimType>({{"SGD", em::OptimType::kSGD},
                                {"ADAM", em::OptimType::kAdam},
                                {"EXACT_ADAGRAD", em::OptimType::kExactAdagrad},
                                {"EXACT_ROWWISE_ADAGRAD", em::OptimType::kExactRowwiseAdagrad},
                                {"FTRL", em::OptimType::kFTRL},
                                {"ROWWISE_RMSPROP_AR", em::OptimType::kRowwiseRmspropAR}});
  d["WeightDecayMode"] =
      enum_dict<em::WeightDecayMode>({{"NONE", em::WeightDecayMode::kNone},
                                      {"L2", em::WeightDecayMode::kL2},
                                      {"DECOUPLE", em::WeightDecayMode::kDecoupled}});
  // Named after RowOptimizer's fields (upper case), which pack by these positions.
  d["OptimField"] = enum_dict<em::OptimField>({{"TYPE", em::kFieldType},
                                               {"LEARNING_RATE", em::kFieldLearningRate},
                                               {"EPS", em::kFieldEps},
                                               {"BETA1", em::kFieldBeta1},
                                               {"BETA2", em::kFieldBeta2},
                                               {"WEIGHT_DECAY", em::kFieldWeightDecay},
                                               {"WEIGHT_DECAY_MODE", em::kFieldWeightDecayMode},
                                               {"STEP", em::kFieldStep},
                                               {"LEARNING_RATE_POWER", em::kFieldLearningRatePower},
                                               {"FTRL_BETA", em::kFieldFtrlBeta},
                                               {"L1_REG", em::kFieldL1Reg},
                                               {"L2_REG", em::kFieldL2Reg},
                                               {"AR_ALPHA", em::kFieldArAlpha},
                                               {"EMA_BETA", em::kFieldEmaBeta},
                                               {"MIN_SHRINKAGE", em::kFieldMinShrinkage},
                                               {"ROW_WARMUP_STEPS", em::kFieldRowWarmupSteps}});
  d["ElementType"] = enum_dict<dyn_emb::storage::ElementType>(
      {{"FLOAT32", dyn_emb::storage::ElementType::kFloat32},
       {"FLOAT16", dyn_emb::storage::ElementType::kFloat16},
       {"BFLOAT16", dyn_emb::storage::ElementType::kBFloat16},
       {"FLOAT8_E4M3FN", dyn_emb::storage::ElementType::kFloat8E4M3}});
  // Lower case: the names of DynamicEmbTableOptions.dist_type.
  d["DistType"] = enum_dict<dyn_emb::routing::DistType>(
      {{"continuous", dyn_emb::routing::DistType::kContinuous},
       {"roundrobin", dyn_emb::routing::DistType::kRoundRobin},
       {"hash_roundrobin", dyn_emb::routing::DistType::kHashRoundRobin}});
  return d;
}

/// An OptimType value from Python, checked.
int32_t checked_optim_type(int64_t type) {
  TORCH_CHECK_VALUE(type >= 0 && type < em::kNumOptimTypes, "dynamicemb: optimizer type ", type,
                    " is not one of 0..", em::kNumOptimTypes - 1);
  return static_cast<int32_t>(type);
}

/// Hash of keys as the table computes it (for tests and tools).
at::Tensor hash_keys(const at::Tensor& keys) {
  TORCH_CHECK(keys.scalar_type() == at::kLong && keys.device().is_cpu(),
              "dynamicemb: hash_keys takes a CPU int64 tensor, got ", keys.scalar_type(), " on ",
              keys.device());
  at::Tensor k = keys.contiguous();
  at::Tensor out = at::empty_like(k);
  const int64_t* src = k.data_ptr<int64_t>();
  int64_t* dst = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < k.numel(); ++i) {
    dst[i] = static_cast<int64_t>(tb::bucket_hash(static_cast<uint64_t>(src[i])));
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "dynamicemb native extension: scored hash table ops (torch.ops.dynamicemb.*)";
  m.def("constants", &constants,
        "Enumerations and constants defined in C++ (cc/table, cc/embedding, cc/routing).");
  m.def("hash_keys", &hash_keys,
        "bucket_hash(key) (murmur3 fmix64) of each key, as int64 bit patterns.");
#ifdef DEMB_WITH_CUDA
  m.def("host_mapped_empty", &dyn_emb::ops::host_mapped_empty,
        "(host, device) uint8 views of nbytes of pinned host memory mapped into a CUDA "
        "device's address space.");
#endif
  m.def(
      "state_dim",
      [](int64_t type, int64_t dim) { return em::state_dim(checked_optim_type(type), dim); },
      "Floats of optimizer state after a float32 row of `dim` (cc/embedding/optimizer.h).");
  m.def(
      "state_used",
      [](int64_t type, int64_t dim) { return em::state_used(checked_optim_type(type), dim); },
      "Floats of that state the update reads and writes (what checkpoints carry).");
  m.def("cuda_built", []() {
#ifdef DEMB_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
}
