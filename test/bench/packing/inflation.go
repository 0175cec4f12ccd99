package packing

import (
	"fmt"
	"math"
	"math/bits"
)

// Inflation fill (Weng et al., ATC'23): pods are offered one by one to an empty cluster,
// with no departures; a pod that does not fit is skipped. What a policy allocates as the
// offered demand grows past the cluster's capacity measures its placement alone.

// MaxOffered is the share of the cluster's slots an inflation fill offers.
const MaxOffered = 1.3

// curveStep is the spacing of the offered shares at which the fill curve is sampled.
const curveStep = 0.05

// InflationRun is one policy's fill of one order of pods. Shares are of the cluster's
// slots, counting each placed device at the slots of the smallest profile that holds it
// (a device given a larger instance counts no more).
type InflationRun struct {
	// At100 and At130 are the allocated share once every pod was offered whose running sum
	// of offered slots stays within 100 % and 130 % of the cluster's slots.
	At100, At130 float64
	// FirstRefusal is the allocated share when the first pod was refused (At130 if none).
	FirstRefusal float64
	// Stranded is, at 130 % offered, the share of slots that are free but that no free
	// legal placement of the smallest refused device's profile covers (0 with no refusal).
	Stranded float64
	// Curve is the allocated share at offered 5 %, 10 %, … 130 %.
	Curve []float64
}

// offeredPoints returns, for each curve point and for 100 % and 130 %, how many pods of
// offered are offered by then (the running sum of slots within the point), and the
// offered share at 100 % (its capacity bound).
func offeredPoints(c *Cluster, offered []Demand) (curve []int, at100, at130 int, share100 float64) {
	capacity := float64(c.Capacity())
	points := int(math.Round(MaxOffered / curveStep))
	curve = make([]int, points)
	sum := 0
	n := 0
	for k := range points {
		limit := float64(k+1) * curveStep * capacity
		for n < len(offered) && float64(sum+c.slotsOf(offered[n])) <= limit+1e-9 {
			sum += c.slotsOf(offered[n])
			n++
		}
		curve[k] = n
		if k+1 == int(math.Round(1/curveStep)) {
			at100, share100 = n, float64(sum)/capacity
		}
	}
	return curve, at100, curve[points-1], share100
}

// slotsOf is a demand's requested slots: devices × the smallest holding profile's slots.
func (c *Cluster) slotsOf(d Demand) int { return d.Devices * c.ProfileSlots(d) }

// Inflate fills an empty cluster with offered, in order, up to 130 % of its slots.
func Inflate(c *Cluster, p Policy, offered []Demand, check bool) (InflationRun, error) {
	curve, at100, at130, _ := offeredPoints(c, offered)
	st := NewState(c)
	capacity := float64(c.Capacity())
	var run InflationRun
	allocated, refused := 0, false
	smallestRefused := 0 // slots of the smallest refused device's profile
	var refusedDemand Demand
	next := 0 // next curve point
	for i := 0; i < at130; i++ {
		d := offered[i]
		if as := p.Place(st, d); as != nil {
			if len(as) != d.Devices {
				return run, fmt.Errorf("%s placed %d devices of %d", p.Name(), len(as), d.Devices)
			}
			st.Apply(as)
			if check {
				if err := st.Check(); err != nil {
					return run, fmt.Errorf("%s, pod %d %+v: %w", p.Name(), i, d, err)
				}
			}
			allocated += c.slotsOf(d)
		} else {
			if !refused {
				refused, run.FirstRefusal = true, float64(allocated)/capacity
			}
			if s := c.ProfileSlots(d); smallestRefused == 0 || s < smallestRefused {
				smallestRefused, refusedDemand = s, d
			}
		}
		for next < len(curve) && curve[next] == i+1 {
			run.Curve = append(run.Curve, float64(allocated)/capacity)
			next++
		}
		if i+1 == at100 {
			run.At100 = float64(allocated) / capacity
		}
	}
	for next < len(curve) {
		run.Curve = append(run.Curve, float64(allocated)/capacity)
		next++
	}
	run.At130 = float64(allocated) / capacity
	if !refused {
		run.FirstRefusal = run.At130
	} else {
		run.Stranded = float64(st.strandedSlots(refusedDemand)) / capacity
	}
	return run, nil
}

// strandedSlots counts the free slots that no free legal placement of the demand's
// smallest holding profile covers, within the GPU's instance counts.
func (st *State) strandedSlots(d Demand) int {
	c := st.C
	mem := c.memory(d)
	n := 0
	for _, node := range st.Nodes {
		for i := range node {
			g := &node[i]
			used := usedMask(g)
			u := useOf(g)
			var usable uint32
			if g.Info.Count == 0 || u.instances < g.Info.Count {
				for _, p := range g.Info.MigProfiles {
					if p.MemoryMB < mem || len(p.Placements) == 0 || p.Placements[0].Size != c.ProfileSlots(d) {
						continue
					}
					if p.Instances > 0 && u.count[p.Name] >= p.Instances {
						continue
					}
					for _, pl := range p.Placements {
						if mask(pl)&used == 0 {
							usable |= mask(pl)
						}
					}
				}
			}
			all := uint32(1)<<uint(c.Slots) - 1
			n += bits.OnesCount32(all &^ used &^ usable)
		}
	}
	return n
}
