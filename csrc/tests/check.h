// A minimal test harness for the core's C++ unit tests: TEST(name) registers a
// function, CHECK(cond) records a failure with file:line and goes on, and
// main() runs every registered test and returns non-zero if any failed. Each
// test binary is one ctest entry.
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace hvdtorch::test {

struct Case {
  const char* name;
  std::function<void()> fn;
};
inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}
inline int& failures() {
  static int n = 0;
  return n;
}
struct Registrar {
  Registrar(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};

}  // namespace hvdtorch::test

#define HVD_CAT2(a, b) a##b
#define HVD_CAT(a, b) HVD_CAT2(a, b)
#define TEST(name)                                                     \
  static void name();                                                  \
  static ::hvdtorch::test::Registrar HVD_CAT(reg_, name)(#name, name); \
  static void name()

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      ++::hvdtorch::test::failures();                                               \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                               \
  } while (0)

#define CHECK_MSG(cond, ...)                                                        \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      ++::hvdtorch::test::failures();                                               \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                            \
      std::fprintf(stderr, "\n");                                                   \
    }                                                                               \
  } while (0)

// CHECK_THROWS(stmt, Type): stmt must throw Type (or a subclass).
#define CHECK_THROWS(stmt, Type)                             \
  do {                                                       \
    bool thrown_ = false;                                    \
    try {                                                    \
      stmt;                                                  \
    } catch (const Type&) {                                  \
      thrown_ = true;                                        \
    } catch (...) {                                          \
    }                                                        \
    CHECK_MSG(thrown_, "expected %s from %s", #Type, #stmt); \
  } while (0)

#define HVD_TEST_MAIN()                                                                           \
  int main() {                                                                                    \
    for (auto& c : ::hvdtorch::test::registry()) {                                                \
      const int before = ::hvdtorch::test::failures();                                            \
      try {                                                                                       \
        c.fn();                                                                                   \
      } catch (const std::exception& e) {                                                         \
        ++::hvdtorch::test::failures();                                                           \
        std::fprintf(stderr, "%s: uncaught exception: %s\n", c.name, e.what());                   \
      }                                                                                           \
      std::printf("[%s] %s\n", ::hvdtorch::test::failures() == before ? "PASS" : "FAIL", c.name); \
    }                                                                                             \
    return ::hvdtorch::test::failures() == 0 ? 0 : 1;                                             \
  }
