package dynamicmig

import (
	"crypto/ed25519"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/signing"
)

// TestBindIsOneWrite: Bind of a GPU pod makes exactly one API request, the create of
// pods/binding whose annotations carry the reservation signed for the pod and its node,
// and touches no Lease. A refused Binding fails the bind with its error after that one
// request, and leaves the pod unbound.
func TestBindIsOneWrite(t *testing.T) {
	withSidecar := gpuPod("with-sidecar", api.ModeMIG, [2]int{1, 4000})
	sidecar := withSidecar.Spec.Containers[0]
	sidecar.Name, sidecar.RestartPolicy = "sidecar", ptr.To(v1.ContainerRestartPolicyAlways)
	withSidecar.Spec.InitContainers = []v1.Container{sidecar}
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		node string
		// reservation: the annotations that hold the reservation; containers: the container
		// index of each MIG record.
		reservation []string
		containers  []int
		// refused: the API server refuses the Binding.
		refused bool
	}{
		{name: "MIG", pod: gpuPod("mig", api.ModeMIG, [2]int{2, 4000}), node: "mig-node",
			reservation: []string{api.MigReservationsAnnotation}, containers: []int{0, 0}},
		{name: "hami-core", pod: gpuPod("core", api.ModeHAMiCore, [2]int{1, 4000}), node: "core-node",
			reservation: []string{api.DevicesAllocatedAnnotation, api.DevicesToAllocateAnnotation}},
		{name: "sidecar and main container", pod: withSidecar, node: "mig-node",
			reservation: []string{api.MigReservationsAnnotation}, containers: []int{0, 1}},
		{name: "Binding refused", pod: gpuPod("refused", api.ModeMIG, [2]int{1, 4000}), node: "mig-node", refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil, []*v1.Node{gpuNode(t, "mig-node", api.ModeMIG, "A100-40GB"), gpuNode(t, "core-node", api.ModeHAMiCore, "A100-40GB")})
			pod := tc.pod.DeepCopy()
			if _, err := e.client.CoreV1().Pods(pod.Namespace).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			state, node, statuses := e.cycle(pod)
			if node != tc.node {
				t.Fatalf("pod on %q, want %s: %s", node, tc.node, reasons(statuses))
			}
			// The signing key is loaded as the plugin starts; wait for it, then count from here.
			key, err := e.pl.signingKeyFor(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			e.client.ClearActions()
			if tc.refused {
				e.client.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
					if a.GetSubresource() != "binding" {
						return false, nil, nil
					}
					return true, nil, apierrors.NewConflict(v1.Resource("pods"), a.(clienttesting.CreateAction).GetObject().(*v1.Binding).Name, errors.New("the object has been modified"))
				})
			}
			st := e.fw.RunBindPlugins(e.ctx, state, pod, node)

			var actions []clienttesting.Action
			for _, a := range e.client.Actions() {
				// The informers' watches start in the background and may land after
				// ClearActions (seen in a cold make test): the informers', not Bind's.
				if a.GetVerb() != "watch" {
					actions = append(actions, a)
				}
			}
			for _, a := range actions {
				if a.GetResource().Resource == "leases" {
					t.Errorf("Bind touched a Lease: %s %s", a.GetVerb(), a.GetResource().Resource)
				}
			}
			if len(actions) != 1 {
				t.Fatalf("Bind made %d API requests, want exactly one (the Binding): %v", len(actions), actions)
			}
			create, ok := actions[0].(clienttesting.CreateAction)
			if !ok || create.GetVerb() != "create" || create.GetResource().Resource != "pods" || create.GetSubresource() != "binding" || create.GetNamespace() != pod.Namespace {
				t.Fatalf("Bind's request: %v, want create pods/binding in %s", actions[0], pod.Namespace)
			}
			binding := create.GetObject().(*v1.Binding)
			if binding.Name != pod.Name || binding.UID != pod.UID || binding.Target.Kind != "Node" || binding.Target.Name != node {
				t.Errorf("Binding %s (UID %s) to %s %s, want %s (UID %s) to Node %s", binding.Name, binding.UID, binding.Target.Kind, binding.Target.Name, pod.Name, pod.UID, node)
			}
			if tc.refused {
				if st.IsSuccess() || !strings.Contains(st.Message(), "binding pod default/refused to mig-node") || !strings.Contains(st.Message(), "the object has been modified") {
					t.Errorf("refused Binding: status %v, want its error", st)
				}
				if p := e.pod(pod.Name); p.Spec.NodeName != "" {
					t.Errorf("pod bound to %s after a refused Binding", p.Spec.NodeName)
				}
				return
			}
			if !st.IsSuccess() {
				t.Fatal(st.AsError())
			}

			// The Binding's annotations: node, phase, reservation and its signature.
			a := binding.Annotations
			if a[api.AssignedNodeAnnotation] != node || a[api.BindPhaseAnnotation] != api.BindPhaseAllocating || a[api.BindTimeAnnotation] == "" {
				t.Errorf("Binding annotations: %v", a)
			}
			for _, k := range tc.reservation {
				if a[k] == "" {
					t.Errorf("Binding carries no %s: %v", k, a)
				}
			}
			if tc.containers != nil {
				recs, err := api.DecodeMigReservations(a[api.MigReservationsAnnotation])
				if err != nil {
					t.Fatal(err)
				}
				var got []int
				for _, r := range recs {
					got = append(got, r.ContainerIndex)
				}
				if !slices.Equal(got, tc.containers) {
					t.Errorf("reserved for containers %v, want %v", got, tc.containers)
				}
			}
			// Bind memoises the records it encoded, exactly as decoding its annotation gives them.
			if raw, ok := a[api.MigReservationsAnnotation]; ok {
				want, err := api.DecodeMigReservations(raw)
				if err != nil {
					t.Fatal(err)
				}
				e.pl.reservations.mu.RLock()
				got, held := e.pl.reservations.decoded[raw]
				e.pl.reservations.mu.RUnlock()
				if !held || !reflect.DeepEqual(got, want) {
					t.Errorf("memoised records of the Binding's annotation: %+v (held %v), want %+v", got, held, want)
				}
			}
			bound := pod.DeepCopy()
			bound.Spec.NodeName, bound.Annotations = binding.Target.Name, binding.Annotations
			if err := signing.NewStaticVerifier(key.Public().(ed25519.PublicKey)).Verify(bound); err != nil {
				t.Errorf("the Binding's reservation does not verify: %v", err)
			}
			// As the API server does, the stored pod now has the node and the annotations.
			stored := e.pod(pod.Name)
			if stored.Spec.NodeName != node || stored.Annotations[api.ReservationSignatureAnnotation] != a[api.ReservationSignatureAnnotation] {
				t.Errorf("stored pod: node %q, annotations %v", stored.Spec.NodeName, stored.Annotations)
			}
		})
	}
}
