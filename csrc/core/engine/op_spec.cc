#include "engine/op_spec.h"

#include <atomic>

#include "common/error.h"

namespace hvdtorch {

namespace {

// The table useOpTable() installed; null before. Written once per process
// (later calls must hand the same table), read by every thread.
std::atomic<const std::vector<OpSpec>*> g_table{nullptr};

const std::vector<OpSpec>& tableInUse() {
  const std::vector<OpSpec>* table = g_table.load(std::memory_order_acquire);
  if (table == nullptr)
    throw InvalidArgument(
        "no op table in use: an Engine is made with ops::opTable() (ops/op_table.h), or "
        "useOpTable() is called, before any request is built or read");
  return *table;
}

}  // namespace

void useOpTable(const std::vector<OpSpec>& table) {
  if (g_table.load(std::memory_order_acquire) == &table) return;
  for (size_t v = 0; v < table.size(); ++v) {
    if (static_cast<size_t>(table[v].type) != v)
      throw InvalidArgument(strCat("op table: row ", v, " (", table[v].name, ") is not at its OpType value"));
    if (table[v].execute == nullptr) throw InvalidArgument(strCat("op table: ", table[v].name, " has no execute"));
    if (table[v].fuses && table[v].args != argsIndex<ReduceArgs>())
      throw InvalidArgument(strCat("op table: ", table[v].name, " fuses but does not carry ReduceArgs"));
  }
  if (table.size() != kOpTypes)
    throw InvalidArgument(strCat("op table: ", table.size(), " rows for ", kOpTypes, " op types"));
  const std::vector<OpSpec>* none = nullptr;
  if (!g_table.compare_exchange_strong(none, &table, std::memory_order_acq_rel) && none != &table)
    throw InvalidArgument("op table: this process already uses another one");
}

const std::vector<OpSpec>& opTable() { return tableInUse(); }

const OpSpec* findOpSpec(uint8_t value) {
  const auto& table = tableInUse();
  return value < table.size() ? &table[value] : nullptr;
}

const OpSpec& opSpec(OpType type) {
  const OpSpec* spec = findOpSpec(static_cast<uint8_t>(type));
  if (!spec) throw InvalidArgument(strCat("op type ", unsigned(static_cast<uint8_t>(type)), " is not in the op table"));
  return *spec;
}

const char* opTypeName(OpType type) {
  const std::vector<OpSpec>* table = g_table.load(std::memory_order_acquire);
  const auto v = static_cast<uint8_t>(type);
  return table != nullptr && v < table->size() ? (*table)[v].name : "unknown";
}

}  // namespace hvdtorch
