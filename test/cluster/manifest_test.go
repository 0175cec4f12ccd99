package cluster

import (
	"slices"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/api"
)

func TestDecodePods(t *testing.T) {
	pods, err := ReadPods("../../examples")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
		// As HAMi's documentation writes them: no schedulerName (the webhook sets it).
		if p.Spec.SchedulerName != "" || p.Annotations[api.VGPUModeAnnotation] != api.ModeMIG {
			t.Errorf("%s: %+v", p.Name, p)
		}
	}
	if !slices.Equal(names, []string{"gpu-pod1", "mig-workload"}) {
		t.Errorf("examples: %v", names)
	}
	if _, err := DecodePods([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: x}\n")); err == nil || !strings.Contains(err.Error(), "Service, not a Pod") {
		t.Errorf("a Service: %v", err)
	}
}
