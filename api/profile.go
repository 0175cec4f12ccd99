package api

import (
	"fmt"
	"regexp"
	"strconv"
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

var profileNameRE = regexp.MustCompile(`^([1-9][0-9]?)g\.([1-9][0-9]{0,3})gb(\+me|-me|\+gfx|\+me\.all)?$`)

// ParseProfileName parses a MIG profile name; the error says what the form should be.
func ParseProfileName(name string) (ProfileName, error) {
	m := profileNameRE.FindStringSubmatch(name)
	if m == nil {
		return ProfileName{}, fmt.Errorf("%q is not a MIG profile name (want <slices>g.<memory>gb with an optional +me, -me, +gfx or +me.all, e.g. 2g.10gb)", name)
	}
	slices, _ := strconv.Atoi(m[1])
	mem, _ := strconv.Atoi(m[2])
	return ProfileName{Slices: slices, MemoryGB: mem, Variant: m[3]}, nil
}

// String formats the name back.
func (p ProfileName) String() string {
	return fmt.Sprintf("%dg.%dgb%s", p.Slices, p.MemoryGB, p.Variant)
}
