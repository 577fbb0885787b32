// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The Python module `dynamicemb._C`: importing it loads the op library; its
// one function hands the table's enumerations and layout constants to Python,
// so they are defined once, in cc/table/types.h.
#include <torch/extension.h>

#include "cc/embedding/initializer.h"
#include "cc/embedding/optimizer.h"
#include "cc/ops/storage_args.h"
#include "cc/storage/row_space.h"
#include "cc/table/hash.h"
#include "cc/table/table_ref.h"
#include "cc/table/types.h"

namespace {

namespace tb = dyn_emb::table;

py::dict table_constants() {
  py::dict d;
  d["EMPTY_KEY"] = tb::kEmptyKey;
  d["LOCKED_KEY"] = tb::kLockedKey;
  d["FIRST_VALID_KEY"] = tb::kFirstValidKey;
  d["EMPTY_DIGEST"] = static_cast<int>(tb::empty_digest());
  d["BUCKET_ALIGNMENT"] = tb::kBucketAlignment;
  d["MAX_SCORES"] = tb::kMaxScores;
  d["INFO_COLS"] = static_cast<int>(tb::kInfoCols);
  d["COUNTER_COLS"] = static_cast<int>(tb::kCounterCols);
  py::dict policy, status, mode, info, counter, op;
  policy["NONE"] = static_cast<int>(tb::ScorePolicy::kNone);
  policy["ASSIGN"] = static_cast<int>(tb::ScorePolicy::kAssign);
  policy["ACCUMULATE"] = static_cast<int>(tb::ScorePolicy::kAccumulate);
  policy["TIMER"] = static_cast<int>(tb::ScorePolicy::kTimer);
  status["FOUND"] = static_cast<int>(tb::InsertStatus::kFound);
  status["INSERTED"] = static_cast<int>(tb::InsertStatus::kInserted);
  status["EVICTED"] = static_cast<int>(tb::InsertStatus::kEvicted);
  status["FAILED"] = static_cast<int>(tb::InsertStatus::kFailed);
  status["INVALID"] = static_cast<int>(tb::InsertStatus::kInvalid);
  status["RELEASED"] = static_cast<int>(tb::InsertStatus::kReleased);
  mode["EVICTING"] = static_cast<int>(tb::TableMode::kEvicting);
  mode["NO_EVICTION"] = static_cast<int>(tb::TableMode::kNoEviction);
  info["SLOT_OFFSET"] = static_cast<int>(tb::kInfoSlotOffset);
  info["CAPACITY"] = static_cast<int>(tb::kInfoCapacity);
  info["BUCKET_CAPACITY"] = static_cast<int>(tb::kInfoBucketCapacity);
  info["BUCKET_OFFSET"] = static_cast<int>(tb::kInfoBucketOffset);
  info["ROW_OFFSET"] = static_cast<int>(tb::kInfoRowOffset);
  info["ROW_CAPACITY"] = static_cast<int>(tb::kInfoRowCapacity);
  info["MODE"] = static_cast<int>(tb::kInfoMode);
  counter["SIZE"] = static_cast<int>(tb::kCounterSize);
  counter["INSERT_FAILURES"] = static_cast<int>(tb::kCounterInsertFailures);
  counter["EVICTIONS"] = static_cast<int>(tb::kCounterEvictions);
  counter["NEXT_ROW"] = static_cast<int>(tb::kCounterNextRow);
  counter["FREE_TOP"] = static_cast<int>(tb::kCounterFreeTop);
  counter["INSERTS"] = static_cast<int>(tb::kCounterInserts);
  op["INSERT"] = static_cast<int>(tb::RunOp::kInsert);
  op["INSERT_EVICT"] = static_cast<int>(tb::RunOp::kInsertEvict);
  op["ERASE"] = static_cast<int>(tb::RunOp::kErase);
  op["PLACE"] = static_cast<int>(tb::RunOp::kPlace);
  py::dict init;
  init["NORMAL"] = static_cast<int>(dyn_emb::embedding::InitMode::kNormal);
  init["TRUNCATED_NORMAL"] = static_cast<int>(dyn_emb::embedding::InitMode::kTruncatedNormal);
  init["UNIFORM"] = static_cast<int>(dyn_emb::embedding::InitMode::kUniform);
  init["CONSTANT"] = static_cast<int>(dyn_emb::embedding::InitMode::kConstant);
  init["DEBUG"] = static_cast<int>(dyn_emb::embedding::InitMode::kDebug);
  d["InitMode"] = init;
  py::dict optim;
  optim["SGD"] = static_cast<int>(dyn_emb::embedding::OptimType::kSGD);
  optim["ADAM"] = static_cast<int>(dyn_emb::embedding::OptimType::kAdam);
  optim["EXACT_ADAGRAD"] = static_cast<int>(dyn_emb::embedding::OptimType::kExactAdagrad);
  optim["EXACT_ROWWISE_ADAGRAD"] =
      static_cast<int>(dyn_emb::embedding::OptimType::kExactRowwiseAdagrad);
  optim["FTRL"] = static_cast<int>(dyn_emb::embedding::OptimType::kFTRL);
  d["OptimType"] = optim;
  py::dict element;
  element["FLOAT32"] = static_cast<int>(dyn_emb::storage::ElementType::kFloat32);
  element["FLOAT16"] = static_cast<int>(dyn_emb::storage::ElementType::kFloat16);
  element["BFLOAT16"] = static_cast<int>(dyn_emb::storage::ElementType::kBFloat16);
  d["ElementType"] = element;
  d["DEBUG_MODULUS"] = dyn_emb::embedding::kDebugModulus;
  d["ScorePolicy"] = policy;
  d["InsertStatus"] = status;
  d["TableMode"] = mode;
  d["InfoCol"] = info;
  d["CounterCol"] = counter;
  d["RunOp"] = op;
  return d;
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
  m.def("table_constants", &table_constants,
        "Enumerations and layout constants of the scored hash table (cc/table/types.h).");
  m.def("hash_keys", &hash_keys,
        "bucket_hash(key) (murmur3 fmix64) of each key, as int64 bit patterns.");
#ifdef DEMB_WITH_CUDA
  m.def("host_mapped_empty", &dyn_emb::ops::host_mapped_empty,
        "(host, device) uint8 views of nbytes of pinned host memory mapped into a CUDA "
        "device's address space.");
#endif
  m.def("cuda_built", []() {
#ifdef DEMB_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
}
