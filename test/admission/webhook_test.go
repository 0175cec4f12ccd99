package admission

import (
	"os"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	webhookapp "github.com/dynamig/dynamig/cmd/dynamig-webhook/app"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/webhook"
)

// installObjects reads manifests/install.yaml into typed objects.
func installObjects(t *testing.T) []runtime.Object {
	t.Helper()
	raw, err := os.ReadFile(installFile)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := cluster.DecodeManifest(raw)
	if err != nil {
		t.Fatalf("decoding %s: %v", installFile, err)
	}
	return objs
}

// TestWebhookManifest keeps the manifest's webhook in step with the validating policy and
// the binary: the API server calls the webhook for every pod the policy checks, and also for
// pods whose regular containers ask only for GPU memory or cores (the webhook gives those the
// device config's defaultGPUNum devices, after which the policy checks them too), with
// the settings docs/architecture.md explains, at the path, port, Secret and names the
// binary uses by default. (test/e2e runs the configuration against the API server.)
func TestWebhookManifest(t *testing.T) {
	var policyCondition string
	objs := installObjects(t)
	for _, obj := range objs {
		if p, ok := obj.(*admissionregistrationv1.ValidatingAdmissionPolicy); ok && p.Name == "dynamig-gpu-pods" {
			policyCondition = p.Spec.MatchConditions[0].Expression
		}
	}
	if policyCondition == "" {
		t.Fatal("no dynamig-gpu-pods policy with a match condition")
	}
	var (
		cfg        *admissionregistrationv1.MutatingWebhookConfiguration
		secret     *v1.Secret
		service    *v1.Service
		deployment *appsv1.Deployment
	)
	for _, obj := range objs {
		switch o := obj.(type) {
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			cfg = o
		case *v1.Secret:
			secret = o
		case *v1.Service:
			if o.Name == webhookapp.DefaultService {
				service = o
			}
		case *appsv1.Deployment:
			if o.Name == webhookapp.DefaultService {
				deployment = o
			}
		}
	}
	if cfg == nil || secret == nil || service == nil || deployment == nil {
		t.Fatalf("want a MutatingWebhookConfiguration, Secret, Service and Deployment")
	}
	if cfg.Name != webhookapp.DefaultWebhookConfiguration || secret.Name != webhookapp.DefaultCertSecret || service.Name != webhookapp.DefaultService {
		t.Errorf("names %s %s %s differ from the binary's defaults", cfg.Name, secret.Name, service.Name)
	}
	if len(cfg.Webhooks) != 1 {
		t.Fatalf("webhooks: %d", len(cfg.Webhooks))
	}
	wh := cfg.Webhooks[0]
	if len(wh.MatchConditions) != 1 {
		t.Fatalf("webhook match conditions: %v", wh.MatchConditions)
	}
	share, ok := strings.CutPrefix(wh.MatchConditions[0].Expression, policyCondition+" ||")
	if !ok {
		t.Errorf("the webhook's match condition must be the policy's or a share:\n%s\npolicy's:\n%s", wh.MatchConditions[0].Expression, policyCondition)
	}
	for _, r := range []string{"nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"} {
		if !strings.Contains(share, "'"+r+"'") {
			t.Errorf("the webhook's share condition does not name %s:\n%s", r, share)
		}
	}
	if *wh.FailurePolicy != admissionregistrationv1.Fail || *wh.SideEffects != admissionregistrationv1.SideEffectClassNone ||
		*wh.TimeoutSeconds != 5 || *wh.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy {
		t.Errorf("settings: failurePolicy %v sideEffects %v timeout %v reinvocation %v", *wh.FailurePolicy, *wh.SideEffects, *wh.TimeoutSeconds, *wh.ReinvocationPolicy)
	}
	if s := wh.ClientConfig.Service; s == nil || s.Name != service.Name || s.Namespace != service.Namespace || *s.Path != webhook.Path || *s.Port != service.Spec.Ports[0].Port {
		t.Errorf("clientConfig %+v does not reach the Service %s/%s at %s", wh.ClientConfig, service.Namespace, service.Name, webhook.Path)
	}
	if len(wh.Rules) != 1 || !slices.Equal(wh.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) ||
		!slices.Equal(wh.Rules[0].Resources, []string{"pods"}) {
		t.Errorf("rules: %+v", wh.Rules)
	}
	for _, sel := range []*metav1.LabelSelector{wh.NamespaceSelector, wh.ObjectSelector} {
		if sel == nil || !slices.ContainsFunc(sel.MatchExpressions, func(r metav1.LabelSelectorRequirement) bool {
			return r.Key == "hami.io/webhook" && r.Operator == metav1.LabelSelectorOpNotIn && slices.Equal(r.Values, []string{"ignore"})
		}) {
			t.Errorf("selector %v lacks HAMi's opt-out label", sel)
		}
	}
	pod := deployment.Spec.Template.Spec
	if pod.ServiceAccountName != "dynamig-webhook" || *deployment.Spec.Replicas < 2 {
		t.Errorf("deployment: service account %q, %d replicas", pod.ServiceAccountName, *deployment.Spec.Replicas)
	}
	c := pod.Containers[0]
	if c.Ports[0].Name != service.Spec.Ports[0].TargetPort.StrVal || c.Ports[0].ContainerPort != 9443 {
		t.Errorf("the Service's targetPort %v is not the webhook's --bind-address default :9443 (%+v)", service.Spec.Ports[0].TargetPort, c.Ports[0])
	}
	mounted := slices.ContainsFunc(pod.Volumes, func(v v1.Volume) bool {
		return v.Secret != nil && v.Secret.SecretName == secret.Name && v.Name == "certs"
	}) &&
		slices.ContainsFunc(c.VolumeMounts, func(m v1.VolumeMount) bool { return m.Name == "certs" && m.MountPath == "/certs" })
	if !mounted {
		t.Errorf("the certificate Secret must be mounted at the default --cert-dir /certs")
	}
}
