package packing

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Workload is a source of pods: an Alibaba trace, or a mix generated with fixed seeds.
type Workload struct {
	Name string
	// Trace holds the trace's pods; nil for a generated mix.
	Trace []Pod
	// Mix is the generated mix's pod kinds.
	Mix []MixEntry
}

// MixEntry is one kind of pod of a generated mix: Devices devices of the model's profile
// with Slices compute slices (7: the full GPU), drawn with weight Weight.
type MixEntry struct {
	Weight  float64
	Devices int
	Slices  int
}

// InferenceMix is mostly small inference servers: one device each, 1g and 2g commonest,
// some 3g and full GPUs.
var InferenceMix = []MixEntry{{0.45, 1, 1}, {0.30, 1, 2}, {0.15, 1, 3}, {0.10, 1, 7}}

// MultiGPUMix is training jobs of 2, 4 and 8 whole GPUs among single-GPU pods of every size.
var MultiGPUMix = []MixEntry{{0.20, 1, 1}, {0.15, 1, 2}, {0.15, 1, 3}, {0.20, 1, 7}, {0.15, 2, 7}, {0.10, 4, 7}, {0.05, 8, 7}}

// TimeUnit is the unit in which the workload's waits are reported, and its length in the
// jobs' time: hours for a trace (its times are seconds; durations are kept), the mean
// lifetime for a generated mix.
func (w *Workload) TimeUnit() (string, float64) {
	if w.Trace != nil {
		return "hours", 3600
	}
	return "mean lifetimes", 1
}

// Describe says what the workload's pods are, for the report.
func (w *Workload) Describe() string {
	if w.Trace != nil {
		return fmt.Sprintf("Alibaba trace openb_pod_list_%s, %d GPU pods", w.Name, len(w.Trace))
	}
	var parts []string
	for _, e := range w.Mix {
		size := fmt.Sprintf("%dg", e.Slices)
		if e.Devices > 1 {
			size = fmt.Sprintf("%d × 7g", e.Devices)
		}
		parts = append(parts, fmt.Sprintf("%s %.0f %%", size, 100*e.Weight))
	}
	return "generated: " + strings.Join(parts, ", ")
}

// mixDemand is the demand of a mix entry on the cluster's model: the memory of the
// smallest published profile with that many slices (0, the full profile, for 7).
func (c *Cluster) mixDemand(e MixEntry) (Demand, error) {
	if e.Slices == 7 {
		return Demand{Devices: e.Devices}, nil
	}
	for _, p := range c.profiles {
		if p.SliceCount == e.Slices {
			return Demand{Devices: e.Devices, MemoryMiB: p.MemoryMB}, nil
		}
	}
	return Demand{}, fmt.Errorf("%s publishes no %dg profile", c.Label(), e.Slices)
}

// mixSampler draws demands of the mix.
type mixSampler struct {
	demands []Demand
	weights []float64
	total   float64
}

func (c *Cluster) newMixSampler(mix []MixEntry) (*mixSampler, error) {
	s := &mixSampler{}
	for _, e := range mix {
		d, err := c.mixDemand(e)
		if err != nil {
			return nil, err
		}
		s.demands = append(s.demands, d)
		s.weights = append(s.weights, e.Weight)
		s.total += e.Weight
	}
	return s, nil
}

func (s *mixSampler) draw(rng *rand.Rand) Demand {
	x := rng.Float64() * s.total
	for k, w := range s.weights {
		if x < w || k == len(s.weights)-1 {
			return s.demands[k]
		}
		x -= w
	}
	panic("unreachable")
}

// Offered is the order in which an inflation fill offers pods: order 0 is the trace in
// file order (a mix: seed 0); order k ≥ 1 a shuffle of the trace (a mix: seed k). Pods
// no empty node can hold are left out; at least want slots are returned, or all there are.
func (w *Workload) Offered(c *Cluster, order int, want int) ([]Demand, error) {
	var out []Demand
	slots := 0
	add := func(d Demand) {
		s := c.ProfileSlots(d)
		if s == 0 || d.Devices > GPUsPerNode {
			return
		}
		out = append(out, d)
		slots += s * d.Devices
	}
	rng := rand.New(rand.NewPCG(uint64(order), 0x6a09e667f3bcc909))
	if w.Trace != nil {
		idx := make([]int, len(w.Trace))
		for i := range idx {
			idx[i] = i
		}
		if order > 0 {
			rng.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
		}
		for _, i := range idx {
			if slots >= want {
				break
			}
			add(c.Demand(w.Trace[i]))
		}
		return out, nil
	}
	s, err := c.newMixSampler(w.Mix)
	if err != nil {
		return nil, err
	}
	for slots < want {
		add(s.draw(rng))
	}
	return out, nil
}

// Jobs is the workload as a queueing replay's arrivals at offered load L. A trace is
// scaled by TraceJobs and, for replay k ≥ 1, jittered (JitterJobs, seed k); a mix is n
// pods with Poisson arrivals and exponential lifetimes of mean 1 at load L (the mean
// requested slots L × the cluster's slots), seed k.
func (w *Workload) Jobs(c *Cluster, load float64, n int, replay int) ([]Job, error) {
	if w.Trace != nil {
		jobs := TraceJobs(c, w.Trace, load)
		if replay > 0 {
			jobs = JitterJobs(jobs, uint64(replay))
		}
		return jobs, nil
	}
	s, err := c.newMixSampler(w.Mix)
	if err != nil {
		return nil, err
	}
	meanSlots := 0.0
	for k, d := range s.demands {
		meanSlots += s.weights[k] / s.total * float64(d.Devices*c.ProfileSlots(d))
	}
	rate := load * float64(c.Capacity()) / meanSlots
	rng := rand.New(rand.NewPCG(uint64(replay), 0x9e3779b97f4a7c15))
	jobs := make([]Job, n)
	t := 0.0
	for i := range jobs {
		t += rng.ExpFloat64() / rate
		jobs[i] = Job{Demand: s.draw(rng), Arrive: t, Depart: t + rng.ExpFloat64()}
	}
	return jobs, nil
}
