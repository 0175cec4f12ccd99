package packing

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Job is one pod of a workload: its demand and its lifetime.
type Job struct {
	Demand         Demand
	Arrive, Depart float64
}

// Outcome is one policy's replay of one workload at one load.
type Outcome struct {
	Policy string
	Load   float64
	// Arrived, Placed and Fragmented (refused although some node had the slots, see
	// State.FragmentedRefusal) count pods.
	Arrived, Placed, Fragmented int
	// Utilisation is the time-averaged share of the cluster's slots in use between the
	// first and the last arrival.
	Utilisation float64
}

// Acceptance is placed / arrived.
func (o Outcome) Acceptance() float64 {
	if o.Arrived == 0 {
		return 0
	}
	return float64(o.Placed) / float64(o.Arrived)
}

// TraceJobs scales the trace to offered load L on the cluster: arrival times are divided by
// a factor f so that Σ(slots × duration) / (arrival span / f) — the mean number of slots
// requested at once over the arrival period — is L × the cluster's slots. Durations stay.
// A pod's slots are its devices × the slots of the smallest profile that holds it; pods no
// profile holds are kept (every policy refuses them).
func TraceJobs(c *Cluster, pods []Pod, load float64) []Job {
	if len(pods) == 0 {
		return nil
	}
	first, last, work := math.Inf(1), math.Inf(-1), 0.0
	for _, p := range pods {
		first, last = min(first, p.Arrive), max(last, p.Arrive)
		work += float64(p.Devices*c.ProfileSlots(c.Demand(p))) * (p.Depart - p.Arrive)
	}
	f := 1.0
	if span := last - first; span > 0 && work > 0 {
		f = load * float64(c.Capacity()) * span / work
	}
	jobs := make([]Job, len(pods))
	for i, p := range pods {
		a := (p.Arrive - first) / f
		jobs[i] = Job{Demand: c.Demand(p), Arrive: a, Depart: a + p.Depart - p.Arrive}
	}
	return jobs
}

// Replay runs the jobs through the policy on an empty cluster: events by time, departures
// before arrivals at equal times; a refused pod is dropped. With check, the whole state is
// verified after every placement.
func Replay(c *Cluster, p Policy, jobs []Job, load float64, check bool) (Outcome, error) {
	type event struct {
		t      float64
		depart bool
		job    int
	}
	events := make([]event, 0, 2*len(jobs))
	first, last := math.Inf(1), math.Inf(-1)
	for i, j := range jobs {
		events = append(events, event{j.Arrive, false, i})
		first, last = min(first, j.Arrive), max(last, j.Arrive)
	}
	slices.SortStableFunc(events, func(a, b event) int { return cmp.Compare(a.t, b.t) })
	st := NewState(c)
	out := Outcome{Policy: p.Name(), Load: load}
	allocs := make([][]Alloc, len(jobs))
	// Departures are pushed as pods are placed; a sorted queue of pending departures.
	var pending []event
	used, area, prev := 0, 0.0, first
	advance := func(t float64) {
		lo, hi := max(prev, first), min(t, last)
		if hi > lo {
			area += float64(used) * (hi - lo)
		}
		prev = max(prev, t)
	}
	depart := func(e event) {
		advance(e.t)
		st.Release(allocs[e.job])
		for _, a := range allocs[e.job] {
			used -= a.Placement.Size
		}
		allocs[e.job] = nil
	}
	for _, e := range events {
		for len(pending) > 0 && pending[0].t <= e.t {
			depart(pending[0])
			pending = pending[1:]
		}
		advance(e.t)
		j := jobs[e.job]
		out.Arrived++
		as := p.Place(st, j.Demand)
		if as == nil {
			if st.FragmentedRefusal(j.Demand) {
				out.Fragmented++
			}
			continue
		}
		if len(as) != j.Demand.Devices {
			return out, fmt.Errorf("%s placed %d devices of %d", p.Name(), len(as), j.Demand.Devices)
		}
		st.Apply(as)
		if check {
			if err := st.Check(); err != nil {
				return out, fmt.Errorf("%s, job %d %+v: %w", p.Name(), e.job, j.Demand, err)
			}
			mem := c.memory(j.Demand)
			for _, a := range as {
				if !profileHolds(c, a.Profile, mem) {
					return out, fmt.Errorf("%s gave %s to a device of %d MiB", p.Name(), a.Profile, mem)
				}
			}
		}
		allocs[e.job] = as
		for _, a := range as {
			used += a.Placement.Size
		}
		out.Placed++
		d := event{j.Depart, true, e.job}
		k, _ := slices.BinarySearchFunc(pending, d, func(a, b event) int { return cmp.Compare(a.t, b.t) })
		pending = slices.Insert(pending, k, d)
	}
	if last > first {
		out.Utilisation = area / (float64(c.Capacity()) * (last - first))
	}
	return out, nil
}

func profileHolds(c *Cluster, name string, mem int) bool {
	for _, p := range c.profiles {
		if p.Name == name {
			return p.MemoryMB >= mem
		}
	}
	return false
}

// ReplayCapacity replays the jobs against a relaxation of the cluster, as a reference for
// the policies: a pod is accepted whenever the cluster's free slots, pooled over every GPU
// and node, cover its devices × the slots of the smallest profile that holds it (no
// placement rules, no GPU or node boundaries, no instance limits). Pods no profile holds
// are refused. It is not a strict upper bound on every policy (refusing a large pod can
// let more small ones in later), but it shows how much of a load's refusals capacity
// alone explains.
func ReplayCapacity(c *Cluster, jobs []Job, load float64) Outcome {
	type event struct {
		t     float64
		slots int
	}
	order := make([]int, len(jobs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(jobs[a].Arrive, jobs[b].Arrive) })
	out := Outcome{Policy: "capacity-only", Load: load}
	free := c.Capacity()
	var pending []event
	for _, i := range order {
		j := jobs[i]
		for len(pending) > 0 && pending[0].t <= j.Arrive {
			free += pending[0].slots
			pending = pending[1:]
		}
		out.Arrived++
		need := c.ProfileSlots(j.Demand) * j.Demand.Devices
		if c.ProfileSlots(j.Demand) == 0 || need > free {
			continue
		}
		free -= need
		out.Placed++
		d := event{j.Depart, need}
		k, _ := slices.BinarySearchFunc(pending, d, func(a, b event) int { return cmp.Compare(a.t, b.t) })
		pending = slices.Insert(pending, k, d)
	}
	return out
}

// JitterJobs delays each arrival (and its departure: durations stay) by a uniform random
// fraction of the mean interarrival time, with a fixed seed: the same workload at the same
// load, with ties and near-ties in the trace's arrivals ordered differently. Replays of
// jittered copies show how much a policy's acceptance moves for reasons that have nothing
// to do with the policy.
func JitterJobs(jobs []Job, seed uint64) []Job {
	if len(jobs) < 2 {
		return jobs
	}
	first, last := math.Inf(1), math.Inf(-1)
	for _, j := range jobs {
		first, last = min(first, j.Arrive), max(last, j.Arrive)
	}
	gap := (last - first) / float64(len(jobs))
	rng := rand.New(rand.NewPCG(seed, 0x2545f4914f6cdd1d))
	out := make([]Job, len(jobs))
	for i, j := range jobs {
		d := rng.Float64() * gap
		out[i] = Job{Demand: j.Demand, Arrive: j.Arrive + d, Depart: j.Depart + d}
	}
	return out
}
