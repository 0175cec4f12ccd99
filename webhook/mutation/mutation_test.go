package mutation

import (
	"encoding/json"
	"regexp"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

var setter = &SchedulerNameSetter{Resource: "nvidia.com/gpu", SchedulerName: "dynamig-scheduler", Replace: []string{"default-scheduler"},
	Shares: []v1.ResourceName{"nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"}, DefaultGPUNum: 1}

// TestDefaultGPUNum: a container that asks for GPU memory or cores in its limits without a
// count gets defaultGPUNum devices, as HAMi's webhook gives them, in its limits and its
// requests, and the pod dynamig-scheduler; per form of the request.
func TestDefaultGPUNum(t *testing.T) {
	const sched = "/spec/schedulerName"
	count := func(i int, where string) string {
		return "/spec/containers/" + string(rune('0'+i)) + "/resources/" + where + "/nvidia.com~1gpu"
	}
	container := func(name string, limits v1.ResourceList) v1.Container {
		requests := limits.DeepCopy() // as the API server defaults them
		return v1.Container{Name: name, Resources: v1.ResourceRequirements{Limits: limits, Requests: requests}}
	}
	q := resource.MustParse
	for _, tc := range []struct {
		name       string
		setter     *SchedulerNameSetter
		scheduler  string
		containers []v1.Container
		want       []string
	}{
		{"gpumem only", setter, "default-scheduler", []v1.Container{container("c", v1.ResourceList{"nvidia.com/gpumem": q("8000")})},
			[]string{sched, count(0, "limits"), count(0, "requests")}},
		{"gpumem-percentage only", setter, "", []v1.Container{container("c", v1.ResourceList{"nvidia.com/gpumem-percentage": q("50")})},
			[]string{sched, count(0, "limits"), count(0, "requests")}},
		{"gpucores only", setter, "", []v1.Container{container("c", v1.ResourceList{"nvidia.com/gpucores": q("30")})},
			[]string{sched, count(0, "limits"), count(0, "requests")}},
		{"none of them", setter, "", []v1.Container{container("c", v1.ResourceList{"cpu": q("1")})}, nil},
		{"a count already", setter, "", []v1.Container{container("c", v1.ResourceList{"nvidia.com/gpu": q("2"), "nvidia.com/gpumem": q("8000")})},
			[]string{sched}},
		{"the second container", setter, "", []v1.Container{container("a", v1.ResourceList{"nvidia.com/gpu": q("1")}), container("b", v1.ResourceList{"nvidia.com/gpumem": q("8000")})},
			[]string{sched, count(1, "limits"), count(1, "requests")}},
		{"no requests map", setter, "", []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"nvidia.com/gpumem": q("8000")}}}},
			[]string{sched, count(0, "limits")}},
		{"names dynamig-scheduler", setter, "dynamig-scheduler", []v1.Container{container("c", v1.ResourceList{"nvidia.com/gpumem": q("8000")})},
			[]string{count(0, "limits"), count(0, "requests")}},
		{"another scheduler's pod", setter, "volcano", []v1.Container{container("c", v1.ResourceList{"nvidia.com/gpumem": q("8000")})}, nil},
		{"defaultGPUNum 0", &SchedulerNameSetter{Resource: setter.Resource, SchedulerName: setter.SchedulerName, Replace: setter.Replace, Shares: setter.Shares},
			"", []v1.Container{container("c", v1.ResourceList{"nvidia.com/gpumem": q("8000")})}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := json.Marshal(&v1.Pod{Spec: v1.PodSpec{SchedulerName: tc.scheduler, Containers: tc.containers}})
			if err != nil {
				t.Fatal(err)
			}
			d, err := tc.setter.Decide(raw)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range d.Patches {
				got = append(got, p.Path)
				want := any("1")
				if p.Path == sched {
					want = "dynamig-scheduler"
				}
				if p.Operation != "add" || p.Value != want {
					t.Errorf("patch %+v, want add of %v", p, want)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("patched %v, want %v (%s)", got, tc.want, d.Reason)
			}
		})
	}
}

// countPath is where a patch may add a container's device count.
var countPath = regexp.MustCompile(`^/spec/containers/[0-9]+/resources/(limits|requests)/nvidia\.com~1gpu$`)

// FuzzDecide: any bytes give a decision or an error, never a panic, and a patch only ever sets
// the scheduler or a regular container's device count.
func FuzzDecide(f *testing.F) {
	seed, _ := json.Marshal(&v1.Pod{Spec: v1.PodSpec{SchedulerName: "default-scheduler", Containers: []v1.Container{{Name: "main",
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("8000")}}}}}})
	f.Add(seed)
	f.Add([]byte(`{"spec":{"initContainers":[{"resources":{"requests":{"nvidia.com/gpu":"1"}}}]}}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"spec":{"containers":[{"name":"a~b/c","resources":{"limits":{"nvidia.com/gpumem":"8000"},"requests":{}}}]}}`))
	f.Add([]byte(`{"spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"1e-99999999"}}}]}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		d, err := setter.Decide(raw)
		if err != nil {
			if len(d.Patches) != 0 {
				t.Fatalf("an error with patches: %v, %+v", err, d.Patches)
			}
			return
		}
		if d.Reason == "" {
			t.Fatalf("a decision without a reason: %+v", d)
		}
		for _, p := range d.Patches {
			scheduler := p.Path == "/spec/schedulerName" && p.Value == "dynamig-scheduler"
			count := countPath.MatchString(p.Path) && p.Value == "1"
			if p.Operation != "add" || !scheduler && !count {
				t.Fatalf("patched %+v", p)
			}
		}
	})
}
