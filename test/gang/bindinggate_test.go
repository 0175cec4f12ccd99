package gang

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// bindingGate is a validating admission webhook on pods/binding, served over TLS to the
// sandbox's API server, that holds the binding of every pod whose name has a prefix until
// released: the scheduler's binding cycles for those pods wait on the API server, with
// their placements reserved, for as long as a test needs to look.
type bindingGate struct {
	prefix  string
	release chan struct{}

	mu   sync.Mutex
	seen map[string]bool // pods whose binding reached the webhook
}

// probe is the name of the binding holdBindings sends until the webhook sees it: the API
// server starts calling a new webhook configuration a moment after it is created.
const probe = "binding-gate-probe"

// holdBindings registers the gate and returns once the API server calls it.
func (w *world) holdBindings(prefix string) *bindingGate {
	w.T.Helper()
	g := &bindingGate{prefix: prefix, release: make(chan struct{}), seen: map[string]bool{}}
	srv := httptest.NewTLSServer(http.HandlerFunc(g.serve))
	w.T.Cleanup(func() { g.open(); srv.Close() })
	caBundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "binding-gate"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "binding-gate.test.dynamig.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(srv.URL + "/bind"), CABundle: caBundle},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods/binding"}}}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			TimeoutSeconds:          ptr.To[int32](30),
		}},
	}
	if _, err := w.C.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(w.Ctx, cfg, metav1.CreateOptions{}); err != nil {
		w.T.Fatal(err)
	}
	w.WaitFor("the API server calling the binding gate", 30*time.Second, func() (bool, string) {
		// Admission runs before the pod is looked up: a binding of no pod reaches the webhook.
		b := &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: probe}, Target: v1.ObjectReference{Kind: "Node", Name: "none"}}
		_ = w.C.CoreV1().Pods("default").Bind(w.Ctx, b, metav1.CreateOptions{})
		return len(g.held()) > 0 || g.saw(probe), "not called yet"
	})
	return g
}

func (g *bindingGate) serve(rw http.ResponseWriter, r *http.Request) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(rw, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	name := review.Request.Name
	g.mu.Lock()
	g.seen[name] = true
	g.mu.Unlock()
	if strings.HasPrefix(name, g.prefix) {
		select {
		case <-g.release:
		case <-r.Context().Done():
		}
	}
	review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	review.Request = nil
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(&review)
}

// held are the pods of the prefix whose binding the gate holds (or held).
func (g *bindingGate) held() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for name := range g.seen {
		if strings.HasPrefix(name, g.prefix) {
			out = append(out, name)
		}
	}
	return out
}

func (g *bindingGate) saw(name string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[name]
}

// open lets every binding, held or to come, through.
func (g *bindingGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.release:
	default:
		close(g.release)
	}
}
