// Status helpers shared by every zeroshard library.
//
// Library code returns absl::Status / absl::StatusOr<T>; these macros pass an
// error up with no extra text (Debian's abseil predates ABSL_RETURN_IF_ERROR).
#ifndef ZEROSHARD_STATUS_H_
#define ZEROSHARD_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define ZS_INTERNAL_CONCAT_IMPL(a, b) a##b
#define ZS_INTERNAL_CONCAT(a, b) ZS_INTERNAL_CONCAT_IMPL(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define ZS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status zs_status_ = (expr);      \
    if (!zs_status_.ok()) return zs_status_; \
  } while (0)

// Evaluates `expr` (an absl::StatusOr<T>); on error returns its status, else
// moves the value into `lhs` (which may be a declaration: `auto x`).
#define ZS_ASSIGN_OR_RETURN(lhs, expr) \
  ZS_INTERNAL_ASSIGN_OR_RETURN(ZS_INTERNAL_CONCAT(zs_statusor_, __LINE__), lhs, expr)

#define ZS_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()

#endif  // ZEROSHARD_STATUS_H_
