package api

import (
	"fmt"
	"strconv"
	"strings"
)

// ProfileName is a parsed MIG GPU-instance profile name such as "2g.10gb", "1g.5gb+me" or
// "1g.24gb+me.all".
type ProfileName struct {
	// Slices is the number of compute slices (the "Ng" part).
	Slices int
	// MemoryGB is the nominal memory (the "Mgb" part); nominal only, the real size comes
	// from NVML or the model table.
	MemoryGB int
	// Variant is "", "+me", "-me", "+gfx" or "+me.all".
	Variant string
}

// ParseProfileName parses a MIG profile name of the form <slices>g.<memory>gb with an
// optional +me, -me, +gfx or +me.all; the error says what the form should be. It is
// hand-written rather than a regular expression: the allocator parses names on its hot path.
func ParseProfileName(name string) (ProfileName, error) {
	bad := func() (ProfileName, error) {
		return ProfileName{}, fmt.Errorf("%q is not a MIG profile name (want <slices>g.<memory>gb with an optional +me, -me, +gfx or +me.all, e.g. 2g.10gb)", name)
	}
	slicesPart, rest, ok := strings.Cut(name, "g.")
	if !ok {
		return bad()
	}
	memPart, variant, ok := strings.Cut(rest, "gb")
	if !ok {
		return bad()
	}
	slices, ok := positive(slicesPart, 2)
	if !ok {
		return bad()
	}
	mem, ok := positive(memPart, 4)
	if !ok {
		return bad()
	}
	switch variant {
	case "", "+me", "-me", "+gfx", "+me.all":
	default:
		return bad()
	}
	return ProfileName{Slices: slices, MemoryGB: mem, Variant: variant}, nil
}

// positive parses 1 to maxDigits decimal digits without a leading zero.
func positive(s string, maxDigits int) (int, bool) {
	if len(s) == 0 || len(s) > maxDigits || s[0] == '0' {
		return 0, false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// String formats the name back.
func (p ProfileName) String() string {
	return fmt.Sprintf("%dg.%dgb%s", p.Slices, p.MemoryGB, p.Variant)
}
