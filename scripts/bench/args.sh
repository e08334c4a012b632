# Sourced by the bench scripts while they parse their options.

# `value "$@"` in an option's case: an option that takes a value, given none, is named and the
# script exits 2 (as for an unknown option).
value() { [[ $# -ge 2 ]] || { echo "$1 needs a value (see --help)" >&2; exit 2; }; }
