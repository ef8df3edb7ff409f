// Closed sets as enums: EnumNames is a closed set's one name table (an enum class numbered 0..N-1,
// its names in enumerator order), used both ways: the name of a value (what goes on the wire or
// into a log) and the value of a name (what a decoder accepts; anything else is refused). And
// Overloaded, the lambda set that std::visit dispatches a std::variant of typed messages to.
//
// Thread-safety: immutable values and pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace edl {

template <typename E, size_t N>
class EnumNames {
 public:
  constexpr explicit EnumNames(std::array<const char*, N> names) : names_(names) {}

  // REQUIRES: e is one of the N enumerators.
  const char* Name(E e) const { return names_[static_cast<size_t>(e)]; }
  // False (and *out unchanged) for a name not in the table.
  bool Parse(std::string_view name, E* out) const {
    for (size_t i = 0; i < N; ++i) {
      if (name == names_[i]) {
        *out = static_cast<E>(i);
        return true;
      }
    }
    return false;
  }
  // The names for a message: "'a', 'b' or 'c'" with quote "'", "a, b or c" with quote "".
  std::string List(const char* quote) const {
    std::string s;
    for (size_t i = 0; i < N; ++i) {
      if (i > 0) s += i + 1 == N ? " or " : ", ";
      s.append(quote).append(names_[i]).append(quote);
    }
    return s;
  }

 private:
  std::array<const char*, N> names_;
};

// std::visit(Overloaded{[](const A&) {...}, [](const B&) {...}}, variant)
template <typename... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <typename... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

}  // namespace edl
