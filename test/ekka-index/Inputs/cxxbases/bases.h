// Bases from namespaces the index does not hold (cutlass, std) are not the
// index's one class of that simple name; a partly qualified base that names
// an indexed class is.
namespace mine {
struct Base {};
} // namespace mine

namespace fi {
struct Sub1 : public cutlass::Base {};
struct Sub2 : public std::Base {};
namespace detail {
struct Inner {};
} // namespace detail
struct Sub3 : detail::Inner {};
} // namespace fi
