// How an op's options struct lists its plain fields (everything but its
// tensors and allocator), so that the Python binding (csrc/torch/bindings/bind_engine.cpp,
// bindOp) binds each by name without naming any op's fields: every options
// struct has
//   static constexpr auto fields() { return std::make_tuple(field("name", &Options::name), ...); }
#pragma once

namespace hvdtorch::ops {

// One plain field: its Python name and the member it is.
template <typename Options, typename T>
struct OptionField {
  const char* name;
  T Options::* member;
};

template <typename Options, typename T>
constexpr OptionField<Options, T> field(const char* name, T Options::* member) {
  return {name, member};
}

}  // namespace hvdtorch::ops
