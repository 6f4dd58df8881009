package driver

import "strconv"

// ParseArgs parses a script's ARGV as integers, for Go twins. It accepts
// between min and max arguments.
func ParseArgs(args []string, min, max int) ([]int64, error) {
	if len(args) < min || len(args) > max {
		return nil, errorf(ErrInvalidPolicy, "%d script arguments, want %d to %d", len(args), min, max)
	}
	v := make([]int64, len(args))
	for i, a := range args {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			return nil, errorf(ErrInvalidPolicy, "script argument %d: %v", i+1, err)
		}
		v[i] = n
	}
	return v, nil
}
