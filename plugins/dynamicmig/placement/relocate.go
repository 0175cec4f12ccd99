package placement

import (
	"cmp"
	"slices"

	"github.com/dynamig/dynamig/api"
)

// Movable is a pod holding MIG instances on a node that may be moved elsewhere (relocated).
type Movable struct {
	// Key names the pod for the caller.
	Key string
	// GPU indexes the node's GPU that holds every instance of the pod: only such pods are
	// movable, a relocation frees room on one GPU.
	GPU       int
	Instances []Instance
}

// MovableOf is a pod's Movable from its MIG reservations on the node's GPUs; false when it
// holds none, or holds instances on more than one GPU or on a GPU the node does not list.
func MovableOf(key string, recs []api.MigReservation, gpus []GPU) (Movable, bool) {
	m := Movable{Key: key, GPU: -1}
	for _, r := range recs {
		g := gpuIndex(gpus, r.GPUUUID)
		if g < 0 || (m.GPU >= 0 && g != m.GPU) {
			return Movable{}, false
		}
		m.GPU = g
		m.Instances = append(m.Instances, Instance{Profile: r.Profile, Placement: r.Placement})
	}
	return m, m.GPU >= 0
}

// Relocation is how a request fits on a node once some pods leave one of its GPUs.
type Relocation struct {
	GPU int
	// Moved are the Keys of the pods that leave, in the order Movables listed them.
	Moved []string
	// Result is the request's fit once they are gone.
	Result *Result
}

// Relocate finds the smallest set of movables on one MIG GPU of the node whose leaving lets
// req fit there: sets of 1 to maxPods pods, each size tried whole before the next; within a
// size, the set freeing the fewest slots first, then the fit of least fragmentation cost,
// then the lower GPU, then the movables' order. accept decides whether a set may move (its
// pods fit elsewhere now); the first set accepted is returned. gpus holds every reservation
// of the node, the movables' included; it is not modified.
func Relocate(gpus []GPU, req *Request, opts Options, movables []Movable, maxPods int, accept func(moved []string) bool) (*Relocation, bool) {
	byGPU := map[int][]Movable{}
	for _, m := range movables {
		if m.GPU >= 0 && m.GPU < len(gpus) && gpus[m.GPU].Info.Mode == api.ModeMIG {
			byGPU[m.GPU] = append(byGPU[m.GPU], m)
		}
	}
	type candidate struct {
		rel   Relocation
		freed int
	}
	for size := 1; size <= maxPods; size++ {
		var found []candidate
		for g, ms := range byGPU {
			if size > len(ms) || !fitsWithout(gpus, g, ms, all(len(ms)), req, opts) {
				continue // not even all of them leaving would do: no subset will
			}
			forEachSubset(len(ms), size, func(idx []int) {
				res, freed, ok := fitWithout(gpus, g, ms, idx, req, opts)
				if !ok {
					return
				}
				moved := make([]string, len(idx))
				for k, i := range idx {
					moved[k] = ms[i].Key
				}
				found = append(found, candidate{Relocation{GPU: g, Moved: moved, Result: res}, freed})
			})
		}
		slices.SortStableFunc(found, func(a, b candidate) int {
			return cmp.Or(cmp.Compare(a.freed, b.freed), cmp.Compare(a.rel.Result.Cost, b.rel.Result.Cost), cmp.Compare(a.rel.GPU, b.rel.GPU))
		})
		for _, c := range found {
			if accept(c.rel.Moved) {
				return &c.rel, true
			}
		}
	}
	return nil, false
}

// FitInTurn says whether the requests fit one after the other on the nodes' GPUs, each
// counting the ones placed before it, every request trying the nodes in order (where pods a
// relocation moves would go: DynamicMIG's PostFilter and kubectl dynamig explain). gpusOf
// gives node n's GPUs as they are now, false for a node that takes none; it is asked once
// per node, and what is placed is added to the GPUs it gave.
func FitInTurn(reqs []*Request, nodes int, gpusOf func(n int) ([]GPU, bool), opts Options) bool {
	room := map[int][]GPU{}
	none := map[int]bool{}
	for _, req := range reqs {
		placed := false
		for n := 0; n < nodes && !placed; n++ {
			if none[n] {
				continue
			}
			gpus, ok := room[n]
			if !ok {
				if gpus, ok = gpusOf(n); !ok {
					none[n] = true
					continue
				}
				room[n] = gpus
			}
			if res, refusal := Fit(gpus, req, opts); refusal == nil {
				AddAssignments(gpus, res.Assignments)
				placed = true
			}
		}
		if !placed {
			return false
		}
	}
	return true
}

// fitWithout fits req on the node with the movables ms[idx] gone from GPU g, and says how
// many slots they free; false when it does not fit, or fits without the room they leave.
func fitWithout(gpus []GPU, g int, ms []Movable, idx []int, req *Request, opts Options) (*Result, int, bool) {
	gone := map[Instance]bool{}
	freed := 0
	for _, i := range idx {
		for _, in := range ms[i].Instances {
			gone[in] = true
			freed += in.Placement.Size
		}
	}
	without := slices.Clone(gpus)
	without[g].MIG = slices.DeleteFunc(slices.Clone(gpus[g].MIG), func(in Instance) bool { return gone[in] })
	res, refusal := Fit(without, req, opts)
	if refusal != nil || !slices.ContainsFunc(res.Assignments, func(a Assignment) bool { return a.GPU == g }) {
		return nil, 0, false
	}
	return res, freed, true
}

// fitsWithout says whether fitWithout fits.
func fitsWithout(gpus []GPU, g int, ms []Movable, idx []int, req *Request, opts Options) bool {
	_, _, ok := fitWithout(gpus, g, ms, idx, req, opts)
	return ok
}

// all is 0..n-1.
func all(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// forEachSubset calls f with every k-subset of 0..n-1, in lexicographic order.
func forEachSubset(n, k int, f func(idx []int)) {
	idx := make([]int, k)
	for i := range idx {
		idx[i] = i
	}
	for {
		f(slices.Clone(idx))
		i := k - 1
		for i >= 0 && idx[i] == n-k+i {
			i--
		}
		if i < 0 {
			return
		}
		idx[i]++
		for j := i + 1; j < k; j++ {
			idx[j] = idx[j-1] + 1
		}
	}
}
