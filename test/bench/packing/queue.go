package packing

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// Queueing replay: a pod that does not fit waits. After every departure the pending pods
// are retried in arrival order, a pod that does not fit not blocking later ones; an
// arrival is tried at once (nothing was freed since the last retry). What it measures is
// how much of the cluster a policy keeps busy while work waits, and how long pods wait.

// QueueOutcome is one policy's queueing replay of one set of jobs. Shares count each
// placed device at the slots of the smallest profile that holds it.
type QueueOutcome struct {
	// UtilArrivals and UtilDrain are the time-averaged share of the cluster's slots in use
	// while at least one pod is pending, before and after the last arrival (NaN when no
	// pod was pending then).
	UtilArrivals, UtilDrain float64
	// DrainTime is how long pods were pending after the last arrival (in the waits' unit),
	// PendingAtLast the pods pending at the last arrival.
	DrainTime     float64
	PendingAtLast int
	// MeanWait and P95Wait are the wait from arrival to placement, in the replay's unit
	// of time; P95BySize the p95 per size (SizeLabel).
	MeanWait, P95Wait float64
	P95BySize         map[string]float64
	// Placed counts pods; Unplaceable pods no empty node holds are left out.
	Placed, Unplaceable int
	// Relocated counts the pods relocation moved (QueueReplayRelocating), RelocatedPerUnit
	// them per unit of time of the whole replay.
	Relocated        int
	RelocatedPerUnit float64
}

// SizeLabel names a demand's size: its smallest profile's slice prefix ("1g", "3g"), with
// the device count when there are several ("4×7g").
func (c *Cluster) SizeLabel(d Demand) string {
	k := c.profileIndex(d)
	if k < 0 {
		return "none"
	}
	name, _, _ := strings.Cut(c.profiles[k].Name, ".")
	if d.Devices > 1 {
		return fmt.Sprintf("%d×%s", d.Devices, name)
	}
	return name
}

// QueueReplay replays the jobs through the policy on an empty cluster, pods waiting until
// they fit; waits are reported in units of unit (the jobs' time). With check, the whole
// state is verified after every placement.
func QueueReplay(c *Cluster, p Policy, jobs []Job, unit float64, check bool) (QueueOutcome, error) {
	return queueReplay(c, p, jobs, unit, check, 0)
}

// QueueReplayRelocating is QueueReplay of dynamig with relocation on and a share of the
// single-device jobs relocatable (chosen by a hash of their index, so the same jobs in every
// replay of a set): a pod that does not fit takes the room of the smallest set of relocatable
// pods on one GPU that each fit on another node now (placement.Relocate, as DynamicMIG's
// PostFilter does), which are placed again at once, keeping their departure times; each is
// relocated at most once (the scheduler's interval, longer than any wait here).
func QueueReplayRelocating(c *Cluster, jobs []Job, unit, share float64, check bool) (QueueOutcome, error) {
	return queueReplay(c, Dynamig{FragmentationAware: true}, jobs, unit, check, share)
}

// relocatable says whether job k is one of the share of relocatable jobs.
func relocatable(k int, share float64) bool {
	return float64(uint32(k)*2654435761%1000) < share*1000
}

// queueReplay is QueueReplay, relocating with a share of relocatable jobs > 0 (p is then
// Dynamig).
func queueReplay(c *Cluster, p Policy, jobs []Job, unit float64, check bool, share float64) (QueueOutcome, error) {
	out := QueueOutcome{P95BySize: map[string]float64{}}
	var order []int
	for i, j := range jobs {
		if c.ProfileSlots(j.Demand) == 0 || j.Demand.Devices > GPUsPerNode {
			out.Unplaceable++
			continue
		}
		order = append(order, i)
	}
	if len(order) == 0 {
		return out, nil
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(jobs[a].Arrive, jobs[b].Arrive) })
	lastArrival := jobs[order[len(order)-1]].Arrive

	type departure struct {
		t   float64
		job int
	}
	st := NewState(c)
	allocs := make(map[int][]Alloc)
	var departures []departure // sorted by time
	var pending []int          // job indices, in arrival order
	waits := map[string][]float64{}
	var allWaits []float64
	used := 0
	now := 0.0
	var busyArr, timeArr, busyDrain, timeDrain float64
	advance := func(t float64) {
		if len(pending) > 0 && t > now {
			// Split the interval at the last arrival.
			if mid := min(max(now, lastArrival), t); mid > now {
				busyArr += float64(used) * (mid - now)
				timeArr += mid - now
			}
			if lo := max(now, lastArrival); t > lo {
				busyDrain += float64(used) * (t - lo)
				timeDrain += t - lo
			}
		}
		now = max(now, t)
	}
	// version counts each node's changes: a relocation that found no set at all on a node
	// (accept never asked) finds none again for the same demand until the node changes.
	version := make([]int, len(st.Nodes))
	apply := func(as []Alloc) {
		st.Apply(as)
		for _, a := range as {
			version[a.Node]++
		}
	}
	release := func(as []Alloc) {
		st.Release(as)
		for _, a := range as {
			version[a.Node]++
		}
	}
	type noSet struct {
		node, version int
		demand        Demand
	}
	hopeless := map[noSet]bool{}
	moved := map[int]bool{}
	// relocate places job i by relocating (share > 0), as placement.Relocate chooses on the
	// first node with the fewest pods to move, and places the moved jobs again.
	relocate := func(i int) []Alloc {
		dyn := p.(Dynamig)
		placed := slices.Sorted(maps.Keys(allocs))
		var best *placement.Relocation
		bestNode := -1
		for n := range st.Nodes {
			key := noSet{n, version[n], jobs[i].Demand}
			if hopeless[key] {
				continue
			}
			var movables []placement.Movable
			for _, k := range placed {
				as := allocs[k]
				if moved[k] || !relocatable(k, share) || len(as) != 1 || as[0].Node != n {
					continue
				}
				movables = append(movables, placement.Movable{Key: strconv.Itoa(k), GPU: as[0].GPU,
					Instances: []placement.Instance{{Profile: as[0].Profile, Placement: as[0].Placement}}})
			}
			maxPods := config.DefaultRelocationMaxPods
			if best != nil {
				maxPods = len(best.Moved) - 1
			}
			asked := false
			// Whether pods fit on the other nodes, one after the other, depends only on their
			// demands in turn: their leaving n changes nothing there. Each sequence is placed
			// once per node, on st itself, and undone.
			fits := map[string]bool{}
			accept := func(keys []string) bool {
				asked = true
				seq := make([]byte, 0, 8*len(keys))
				for _, key := range keys {
					k, _ := strconv.Atoi(key)
					seq = fmt.Appendf(seq, "%d×%d,", jobs[k].Demand.Devices, jobs[k].Demand.MemoryMiB)
				}
				if ok, seen := fits[string(seq)]; seen {
					return ok
				}
				var placed [][]Alloc
				for _, key := range keys {
					k, _ := strconv.Atoi(key)
					as := dyn.placeExcept(st, jobs[k].Demand, n)
					if as == nil {
						break
					}
					st.Apply(as)
					placed = append(placed, as)
				}
				for x := len(placed) - 1; x >= 0; x-- {
					st.Release(placed[x])
				}
				ok := len(placed) == len(keys)
				fits[string(seq)] = ok
				return ok
			}
			rel, ok := placement.Relocate(st.Nodes[n], request(jobs[i].Demand), dyn.options(), movables, maxPods, accept)
			switch {
			case ok:
				best, bestNode = rel, n
			case !asked && maxPods == config.DefaultRelocationMaxPods:
				hopeless[key] = true
			}
		}
		if best == nil {
			return nil
		}
		var keys []int
		for _, key := range best.Moved {
			k, _ := strconv.Atoi(key)
			keys = append(keys, k)
			release(allocs[k])
			used -= c.slotsOf(jobs[k].Demand)
		}
		fit := make([]Alloc, len(best.Result.Assignments))
		for x, a := range best.Result.Assignments {
			fit[x] = Alloc{Node: bestNode, GPU: a.GPU, Profile: a.Profile, Placement: a.Placement}
		}
		apply(fit) // the moved pods are placed again around it
		for _, k := range keys {
			as := dyn.Place(st, jobs[k].Demand) // accept found room elsewhere, which the pod's fit leaves
			apply(as)
			allocs[k] = as
			used += c.slotsOf(jobs[k].Demand)
			moved[k] = true
		}
		release(fit) // try applies it
		out.Relocated += len(keys)
		return fit
	}
	try := func(i int) (bool, error) {
		j := jobs[i]
		as := p.Place(st, j.Demand)
		if as == nil && share > 0 {
			as = relocate(i)
		}
		if as == nil {
			return false, nil
		}
		if len(as) != j.Demand.Devices {
			return false, fmt.Errorf("%s placed %d devices of %d", p.Name(), len(as), j.Demand.Devices)
		}
		apply(as)
		if check {
			if err := st.Check(); err != nil {
				return false, fmt.Errorf("%s, job %d %+v: %w", p.Name(), i, j.Demand, err)
			}
		}
		allocs[i] = as
		used += c.slotsOf(j.Demand)
		w := (now - j.Arrive) / unit
		allWaits = append(allWaits, w)
		label := c.SizeLabel(j.Demand)
		waits[label] = append(waits[label], w)
		out.Placed++
		d := departure{now + j.Depart - j.Arrive, i}
		k, _ := slices.BinarySearchFunc(departures, d, func(a, b departure) int { return cmp.Compare(a.t, b.t) })
		departures = slices.Insert(departures, k, d)
		return true, nil
	}
	// retry tries every pending pod in order; a size class refused once in a pass is
	// refused for the rest of it (the pass only takes room), so it is not asked again.
	retry := func() error {
		type class struct{ devices, profile int }
		refused := map[class]bool{}
		kept := pending[:0]
		for _, i := range pending {
			d := jobs[i].Demand
			k := class{d.Devices, c.profileIndex(d)}
			if !refused[k] {
				ok, err := try(i)
				if err != nil {
					return err
				}
				if ok {
					continue
				}
				refused[k] = true
			}
			kept = append(kept, i)
		}
		pending = kept
		return nil
	}
	next := 0
	for next < len(order) || len(departures) > 0 {
		if len(departures) > 0 && (next == len(order) || departures[0].t <= jobs[order[next]].Arrive) {
			d := departures[0]
			departures = departures[1:]
			advance(d.t)
			release(allocs[d.job])
			used -= c.slotsOf(jobs[d.job].Demand)
			delete(allocs, d.job)
			if err := retry(); err != nil {
				return out, err
			}
			continue
		}
		i := order[next]
		next++
		advance(jobs[i].Arrive)
		ok, err := try(i)
		if err != nil {
			return out, err
		}
		if !ok {
			pending = append(pending, i)
		}
		if next == len(order) {
			out.PendingAtLast = len(pending)
		}
	}
	if len(pending) > 0 {
		return out, fmt.Errorf("%s: %d pods still pending on an empty cluster", p.Name(), len(pending))
	}
	capacity := float64(c.Capacity())
	out.UtilArrivals, out.UtilDrain = math.NaN(), math.NaN()
	if timeArr > 0 {
		out.UtilArrivals = busyArr / (capacity * timeArr)
	}
	if timeDrain > 0 {
		out.UtilDrain = busyDrain / (capacity * timeDrain)
	}
	out.DrainTime = timeDrain / unit
	if now > 0 {
		out.RelocatedPerUnit = float64(out.Relocated) / (now / unit)
	}
	for _, w := range allWaits {
		out.MeanWait += w
	}
	out.MeanWait /= float64(len(allWaits))
	out.P95Wait = percentile(allWaits, 0.95)
	for label, ws := range waits {
		out.P95BySize[label] = percentile(ws, 0.95)
	}
	return out, nil
}

// percentile is the q-quantile of xs (nearest rank); xs is not modified.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	k := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}
