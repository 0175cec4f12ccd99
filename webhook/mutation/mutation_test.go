package mutation

import (
	"encoding/json"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

var setter = &SchedulerNameSetter{Resource: "nvidia.com/gpu", SchedulerName: "dynamig-scheduler", Replace: []string{"default-scheduler"}}

// FuzzDecide: any bytes give a decision or an error, never a panic, and a patch only ever sets
// the scheduler.
func FuzzDecide(f *testing.F) {
	seed, _ := json.Marshal(&v1.Pod{Spec: v1.PodSpec{SchedulerName: "default-scheduler", Containers: []v1.Container{{Name: "main",
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("8000")}}}}}})
	f.Add(seed)
	f.Add([]byte(`{"spec":{"initContainers":[{"resources":{"requests":{"nvidia.com/gpu":"1"}}}]}}`))
	f.Add([]byte(`null`))
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
			if p.Operation != "add" || p.Path != "/spec/schedulerName" || p.Value != "dynamig-scheduler" {
				t.Fatalf("patched %+v", p)
			}
		}
	})
}
