// Package webhook is dynamig's mutating admission webhook. A pod that asks for the GPU
// count resource and names no scheduler gets schedulerName: dynamig-scheduler, as HAMi's
// webhook does, so HAMi's pods and its documentation's examples run unchanged. It patches
// that one field and nothing else; the chart's ValidatingAdmissionPolicies (manifests/charts/dynamig) still
// refuse a GPU pod that names another scheduler.
package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Path is where the webhook is served; the MutatingWebhookConfiguration calls it.
const Path = "/mutate-v1-pod"

// SchedulerNameSetter sets the scheduler of GPU pods that name none.
type SchedulerNameSetter struct {
	// Resource is the GPU count resource, the device config's resourceCountName.
	Resource v1.ResourceName
	// SchedulerName is what the pods get: dynamig-scheduler.
	SchedulerName string
	// Replace lists the scheduler names that count as naming none, besides the empty one
	// (the API server has defaulted an empty one to default-scheduler before mutating
	// admission, so default-scheduler belongs here).
	Replace []string
}

var _ admission.Handler = (*SchedulerNameSetter)(nil)

// Handle answers one AdmissionReview: pods it should mutate get a JSON patch of
// /spec/schedulerName, everything else is allowed unchanged.
func (s *SchedulerNameSetter) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.Resource.Resource != "pods" || req.SubResource != "" {
		return admission.Allowed("not a pod creation")
	}
	pod := &admittedPod{}
	if err := json.Unmarshal(req.Object.Raw, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the pod: %w", err))
	}
	if !s.asksForGPU(pod) {
		return admission.Allowed("the pod asks for no " + string(s.Resource))
	}
	if !s.namesNoScheduler(pod) {
		return admission.Allowed("the pod names schedulerName " + pod.Spec.SchedulerName)
	}
	klog.FromContext(ctx).V(2).Info("Setting the scheduler of a GPU pod", "pod", klog.KRef(req.Namespace, pod.name()),
		"from", pod.Spec.SchedulerName, "to", s.SchedulerName)
	// "add" replaces an existing member (RFC 6902), so one operation serves a pod with or
	// without the field.
	return admission.Patched("schedulerName set to "+s.SchedulerName, jsonpatch.NewOperation("add", "/spec/schedulerName", s.SchedulerName))
}

// admittedPod is the part of a pod the webhook reads. Resource quantities stay undecoded:
// only their names matter here, and parsing a hostile quantity costs time that grows with
// its exponent (1e-99999999 takes hours), which anyone who can reach the Service could send.
type admittedPod struct {
	Metadata struct {
		Name         string `json:"name"`
		GenerateName string `json:"generateName"`
	} `json:"metadata"`
	Spec struct {
		SchedulerName  string              `json:"schedulerName"`
		InitContainers []admittedContainer `json:"initContainers"`
		Containers     []admittedContainer `json:"containers"`
	} `json:"spec"`
}

type admittedContainer struct {
	Resources struct {
		Limits   map[v1.ResourceName]json.RawMessage `json:"limits"`
		Requests map[v1.ResourceName]json.RawMessage `json:"requests"`
	} `json:"resources"`
}

// asksForGPU reports whether any container or init container names the GPU count resource
// in its limits or requests, as the validating policy's match condition does.
func (s *SchedulerNameSetter) asksForGPU(pod *admittedPod) bool {
	return slices.ContainsFunc(pod.Spec.InitContainers, s.containerAsks) || slices.ContainsFunc(pod.Spec.Containers, s.containerAsks)
}

func (s *SchedulerNameSetter) containerAsks(c admittedContainer) bool {
	_, inLimits := c.Resources.Limits[s.Resource]
	_, inRequests := c.Resources.Requests[s.Resource]
	return inLimits || inRequests
}

// namesNoScheduler reports whether the pod's schedulerName is empty or one of Replace.
func (s *SchedulerNameSetter) namesNoScheduler(pod *admittedPod) bool {
	return pod.Spec.SchedulerName == "" || slices.Contains(s.Replace, pod.Spec.SchedulerName)
}

// name is the pod's name, or its generateName prefix before the API server names it.
func (p *admittedPod) name() string {
	if p.Metadata.Name != "" {
		return p.Metadata.Name
	}
	return p.Metadata.GenerateName
}
