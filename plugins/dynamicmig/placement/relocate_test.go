package placement

import (
	"slices"
	"testing"

	"github.com/dynamig/dynamig/api"
)

// one1g is a 1g.5gb pod's instance at slot start of an A100-40GB.
func one1g(key string, gpu, start int) Movable {
	return Movable{Key: key, GPU: gpu, Instances: []Instance{{Profile: "1g.5gb", Placement: api.Placement{Start: start, Size: 1}}}}
}

// TestRelocate: on A100-40GBs whose 3g.20gb placements ([0,4), [4,8)) are blocked by 1g.5gb
// pods, a 3g.20gb pod fits once the smallest set of movable pods on one GPU leaves: one pod
// before two, the set accept refuses skipped, a pod that may not move never in a set, no
// set beyond maxPods, and no set where the pod fits without the room it frees.
func TestRelocate(t *testing.T) {
	threeG := migPod(1, 19000)
	node := func(holders ...Movable) []GPU {
		gpus := inventoryOf(t, "", "", "A100-40GB", "A100-40GB")
		for _, h := range holders {
			gpus[h.GPU].MIG = append(gpus[h.GPU].MIG, h.Instances...)
		}
		return gpus
	}
	all := func([]string) bool { return true }
	for _, tc := range []struct {
		name    string
		holders []Movable // on the node
		movable []string  // the holders that may move
		maxPods int
		refuse  []string // a set accept refuses
		want    []string // nil: no relocation
		wantGPU int
	}{
		// Either one frees a placement; moving b leaves the least fragmentation.
		{name: "one of two blockers", holders: []Movable{one1g("a", 0, 1), one1g("b", 0, 5)}, movable: []string{"a", "b"}, maxPods: 3, want: []string{"b"}},
		{name: "accept refuses the first", holders: []Movable{one1g("a", 0, 1), one1g("b", 0, 5)}, movable: []string{"a", "b"}, maxPods: 3, refuse: []string{"b"}, want: []string{"a"}},
		{name: "one pod before two", holders: []Movable{one1g("a", 0, 1), one1g("b", 0, 2), one1g("c", 0, 5)}, movable: []string{"a", "b", "c"}, maxPods: 3, want: []string{"c"}},
		{name: "only the movable ones", holders: []Movable{one1g("a", 0, 1), one1g("b", 0, 2), one1g("c", 0, 5)}, movable: []string{"a", "b"}, maxPods: 3, want: []string{"a", "b"}},
		{name: "no more than maxPods", holders: []Movable{one1g("a", 0, 1), one1g("b", 0, 2), one1g("c", 0, 5)}, movable: []string{"a", "b"}, maxPods: 1},
		{name: "nothing movable", holders: []Movable{one1g("a", 0, 1), one1g("b", 0, 5)}, maxPods: 3},
		{name: "the other GPU", holders: []Movable{one1g("a", 0, 1), one1g("b", 0, 5), one1g("c", 1, 2), one1g("d", 1, 6)}, movable: []string{"c"}, maxPods: 3, want: []string{"c"}, wantGPU: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpus := node(tc.holders...)
			if !slices.ContainsFunc(tc.holders, func(h Movable) bool { return h.GPU == 1 }) {
				// GPU 1 holds a 7g.40gb: the pod fits only on GPU 0.
				gpus[1].MIG = append(gpus[1].MIG, Instance{Profile: "7g.40gb", Placement: api.Placement{Start: 0, Size: 8}})
			}
			if _, refusal := Fit(gpus, threeG, defaultOpts); refusal == nil {
				t.Fatal("the pod fits without a relocation")
			}
			var movables []Movable
			for _, h := range tc.holders {
				if slices.Contains(tc.movable, h.Key) {
					movables = append(movables, h)
				}
			}
			accept := all
			if tc.refuse != nil {
				accept = func(moved []string) bool { return !slices.Equal(moved, tc.refuse) }
			}
			before := slices.Clone(gpus[0].MIG)
			rel, ok := Relocate(gpus, threeG, defaultOpts, movables, tc.maxPods, accept)
			if !slices.Equal(gpus[0].MIG, before) {
				t.Fatal("Relocate changed the node's reservations")
			}
			if tc.want == nil {
				if ok {
					t.Fatalf("relocation %v, want none", rel.Moved)
				}
				return
			}
			if !ok || !slices.Equal(rel.Moved, tc.want) || rel.GPU != tc.wantGPU {
				t.Fatalf("relocation %+v (%v), want %v from GPU %d", rel, ok, tc.want, tc.wantGPU)
			}
			// The fit is legal on the node without the moved pods, and uses their room.
			without := slices.Clone(gpus)
			without[rel.GPU].MIG = slices.DeleteFunc(slices.Clone(gpus[rel.GPU].MIG), func(in Instance) bool {
				for _, h := range tc.holders {
					if slices.Contains(rel.Moved, h.Key) && h.GPU == rel.GPU && h.Instances[0] == in {
						return true
					}
				}
				return false
			})
			checkDisjoint(t, without, rel.Result)
			if rel.Result.Assignments[0].Profile != "3g.20gb" || rel.Result.Assignments[0].GPU != rel.GPU {
				t.Errorf("fit %+v, want 3g.20gb on GPU %d", rel.Result.Assignments[0], rel.GPU)
			}
		})
	}
}

func TestForEachSubset(t *testing.T) {
	var got [][]int
	forEachSubset(4, 2, func(idx []int) { got = append(got, idx) })
	want := [][]int{{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("2-subsets of 4: %v, want %v", got, want)
	}
}
