package webhook

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/dynamig/dynamig/webhook/mutation"
)

var setter = &SchedulerNameSetter{mutation.SchedulerNameSetter{Resource: "nvidia.com/gpu", SchedulerName: "dynamig-scheduler", Replace: []string{"default-scheduler"}}}

func gpuContainer(name string, resources v1.ResourceList, inRequests bool) v1.Container {
	c := v1.Container{Name: name, Image: "ubuntu:22.04"}
	if inRequests {
		c.Resources.Requests = resources
	} else {
		c.Resources.Limits = resources
	}
	return c
}

func gpu(n string) v1.ResourceList {
	return v1.ResourceList{"nvidia.com/gpu": resource.MustParse(n), "nvidia.com/gpumem": resource.MustParse("8000")}
}

func request(t *testing.T, op admissionv1.Operation, pod *v1.Pod) admission.Request {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "u", Operation: op, Namespace: "default",
		Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Object:   runtime.RawExtension{Raw: raw},
	}}
}

func TestSchedulerNameSetter(t *testing.T) {
	setName := []jsonpatch.Operation{jsonpatch.NewOperation("add", "/spec/schedulerName", "dynamig-scheduler")}
	pod := func(scheduler string, init []v1.Container, containers ...v1.Container) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1.PodSpec{SchedulerName: scheduler, InitContainers: init, Containers: containers}}
	}
	cpu := v1.Container{Name: "cpu", Image: "busybox"}
	for _, tc := range []struct {
		name string
		op   admissionv1.Operation
		pod  *v1.Pod
		want []jsonpatch.Operation // nil: allowed unchanged
	}{
		{"GPU pod, default scheduler", admissionv1.Create, pod("default-scheduler", nil, gpuContainer("main", gpu("2"), false)), setName},
		{"GPU pod, no scheduler", admissionv1.Create, pod("", nil, gpuContainer("main", gpu("1"), false)), setName},
		{"GPU in requests only", admissionv1.Create, pod("default-scheduler", nil, gpuContainer("main", gpu("1"), true)), setName},
		{"GPU in the second container", admissionv1.Create, pod("default-scheduler", nil, cpu, gpuContainer("main", gpu("1"), false)), setName},
		{"GPU in an init container", admissionv1.Create, pod("default-scheduler", []v1.Container{gpuContainer("init", gpu("1"), false)}, cpu), setName},
		{"GPU pod naming dynamig already", admissionv1.Create, pod("dynamig-scheduler", nil, gpuContainer("main", gpu("1"), false)), nil},
		{"GPU pod naming another scheduler", admissionv1.Create, pod("volcano", nil, gpuContainer("main", gpu("1"), false)), nil},
		{"CPU pod", admissionv1.Create, pod("default-scheduler", nil, cpu), nil},
		{"gpumem without the count resource", admissionv1.Create, pod("default-scheduler", nil, gpuContainer("main", v1.ResourceList{"nvidia.com/gpumem": resource.MustParse("8000")}, false)), nil},
		{"update", admissionv1.Update, pod("default-scheduler", nil, gpuContainer("main", gpu("1"), false)), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := setter.Handle(context.Background(), request(t, tc.op, tc.pod))
			if !resp.Allowed {
				t.Fatalf("refused: %+v", resp.Result)
			}
			if !reflect.DeepEqual(resp.Patches, tc.want) {
				t.Errorf("patches %+v, want %+v", resp.Patches, tc.want)
			}
		})
	}
}

// TestConfiguredNames: another count resource and another list of names to replace.
func TestConfiguredNames(t *testing.T) {
	s := &SchedulerNameSetter{mutation.SchedulerNameSetter{Resource: "example.com/gpu", SchedulerName: "dynamig-scheduler", Replace: []string{"default-scheduler", "legacy"}}}
	legacy := &v1.Pod{Spec: v1.PodSpec{SchedulerName: "legacy", Containers: []v1.Container{gpuContainer("main", v1.ResourceList{"example.com/gpu": resource.MustParse("1")}, false)}}}
	if resp := s.Handle(context.Background(), request(t, admissionv1.Create, legacy)); len(resp.Patches) != 1 {
		t.Errorf("legacy scheduler: %+v", resp)
	}
	nvidia := &v1.Pod{Spec: v1.PodSpec{SchedulerName: "default-scheduler", Containers: []v1.Container{gpuContainer("main", gpu("1"), false)}}}
	if resp := s.Handle(context.Background(), request(t, admissionv1.Create, nvidia)); len(resp.Patches) != 0 {
		t.Errorf("nvidia.com/gpu is not this setter's resource: %+v", resp)
	}
}

func TestUndecodablePod(t *testing.T) {
	req := request(t, admissionv1.Create, &v1.Pod{})
	req.Object.Raw = []byte(`{"spec": {"containers": 3}}`)
	resp := setter.Handle(context.Background(), req)
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusBadRequest {
		t.Errorf("got %+v", resp)
	}
}

// TestHostileQuantity: the webhook does not parse quantities, so one whose parse would take
// hours is answered at once (the test's deadline is the bound).
func TestHostileQuantity(t *testing.T) {
	req := request(t, admissionv1.Create, &v1.Pod{})
	req.Object.Raw = []byte(`{"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1e-99999999"}}}]}}`)
	done := make(chan admission.Response, 1)
	go func() { done <- setter.Handle(context.Background(), req) }()
	select {
	case resp := <-done:
		if len(resp.Patches) != 1 {
			t.Errorf("got %+v", resp)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10 s: the quantity was parsed")
	}
}
