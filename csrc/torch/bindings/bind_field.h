// One plain field of an options struct (ops/option_fields.h), bound by
// its name: the ops' options structs (bind_engine.cpp) and
// GradientReducerOptions (bind_gradients.cpp) are filled from Python this way.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <type_traits>

#include "ops/op_common.h"
#include "ops/option_fields.h"

namespace hvdtorch {

// Binds one plain field of an options struct by its name; a reduce op as
// Horovod's int, checked by toReduceOp when set.
template <typename Options, typename T>
void bindField(pybind11::class_<Options>& c, const ops::OptionField<Options, T>& f) {
  if constexpr (std::is_same_v<T, ReduceOp>) {
    const auto member = f.member;
    c.def_property(
        f.name, [member](const Options& o) { return static_cast<int>(o.*member); },
        [member](Options& o, int op) { o.*member = ops::toReduceOp(op); });
  } else {
    c.def_readwrite(f.name, f.member);
  }
}

}  // namespace hvdtorch
