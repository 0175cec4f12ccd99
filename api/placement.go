package api

import "fmt"

// Placement is a GPU instance's position in a GPU's memory slots: the half-open interval
// [Start, Start+Size). Both fields are always written: a start of 0 is a real position.
type Placement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// End is the first slot after the placement.
func (p Placement) End() int { return p.Start + p.Size }

// Overlaps reports whether two placements share a slot.
func (p Placement) Overlaps(o Placement) bool {
	return p.Start < o.End() && o.Start < p.End()
}

// Within reports whether the placement lies inside a GPU of the given number of slots.
func (p Placement) Within(slots int) bool {
	return p.Start >= 0 && p.Size > 0 && p.End() <= slots
}

// String prints the interval as [start,end).
func (p Placement) String() string { return fmt.Sprintf("[%d,%d)", p.Start, p.End()) }
