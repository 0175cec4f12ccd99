// Package webhook is dynamig's mutating admission webhook. A pod that asks for the GPU
// count resource and names no scheduler gets schedulerName: dynamig-scheduler, as HAMi's
// webhook does, so HAMi's pods and its documentation's examples run unchanged. It patches
// that one field and nothing else; the chart's ValidatingAdmissionPolicies (manifests/charts/dynamig) still
// refuse a GPU pod that names another scheduler. What changes is decided by package mutation,
// from the pod's JSON alone; this package answers the API server's AdmissionReviews with it.
package webhook

import (
	"context"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/dynamig/dynamig/webhook/mutation"
)

// Path is where the webhook is served; the MutatingWebhookConfiguration calls it.
const Path = "/mutate-v1-pod"

// SchedulerNameSetter answers AdmissionReviews of pod creations with the setter's decisions.
type SchedulerNameSetter struct{ mutation.SchedulerNameSetter }

var _ admission.Handler = (*SchedulerNameSetter)(nil)

// Handle answers one AdmissionReview: pods it should mutate get a JSON patch of
// /spec/schedulerName, everything else is allowed unchanged.
func (s *SchedulerNameSetter) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.Resource.Resource != "pods" || req.SubResource != "" {
		return admission.Allowed("not a pod creation")
	}
	d, err := s.Decide(req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if len(d.Patches) == 0 {
		return admission.Allowed(d.Reason)
	}
	klog.FromContext(ctx).V(2).Info("Setting the scheduler of a GPU pod", "pod", klog.KRef(req.Namespace, d.Pod),
		"from", d.From, "to", s.SchedulerName)
	return admission.Patched(d.Reason, d.Patches...)
}
