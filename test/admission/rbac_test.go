package admission

import (
	"context"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/test/cluster"
)

// testRBAC asks the API server's authorizer, with SubjectAccessReviews, what the three
// service accounts may do under the manifest's RBAC (applyRBAC).
func testRBAC(ctx context.Context, t *testing.T, admin kubernetes.Interface) {
	sys, signingNS := api.DefaultSystemNamespace, api.DefaultSigningKeyNamespace
	type check struct {
		verb, group, resource, subresource, namespace, name string
		allowed                                             bool
	}
	cases := map[string][]check{
		cluster.UserScheduler: {
			{verb: "create", resource: "pods", subresource: "binding", namespace: "team-a", allowed: true},
			// It evicts the pods a device plugin marked failed.
			{verb: "create", resource: "pods", subresource: "eviction", namespace: "team-a", allowed: true},
			{verb: "list", resource: "nodes", allowed: true},
			{verb: "watch", resource: "pods", allowed: true},
			{verb: "create", resource: "events", namespace: "team-a", allowed: true},
			{verb: "get", resource: "configmaps", namespace: "kube-system", name: "extension-apiserver-authentication", allowed: true},
			{verb: "create", group: "authentication.k8s.io", resource: "tokenreviews", allowed: true},
			// The heartbeat Leases it follows, and its own leader-election Lease; no hand-off
			// Lease any more.
			{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: sys, name: api.HeartbeatLeaseName("n1"), allowed: true},
			{verb: "list", group: "coordination.k8s.io", resource: "leases", namespace: sys, allowed: true},
			{verb: "watch", group: "coordination.k8s.io", resource: "leases", namespace: sys, allowed: true},
			{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: sys, allowed: true}, // system:kube-scheduler: any Lease
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: sys, name: "dynamig-scheduler", allowed: true},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: sys, name: "dynamig-handoff-n1"},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: sys, name: api.HeartbeatLeaseName("n1")},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: sys},
			{verb: "delete", group: "coordination.k8s.io", resource: "leases", namespace: sys, name: "dynamig-scheduler"},
			{verb: "patch", resource: "nodes"},
			{verb: "list", resource: "secrets", namespace: sys},
			{verb: "get", resource: "secrets", namespace: signingNS, name: api.SigningKeySecretName, allowed: true},
			{verb: "create", resource: "secrets", namespace: signingNS, allowed: true},
			{verb: "update", resource: "secrets", namespace: signingNS, name: api.SigningKeySecretName},
			{verb: "list", resource: "secrets", namespace: signingNS},
			{verb: "create", resource: "configmaps", namespace: sys, allowed: true},
			{verb: "get", resource: "configmaps", namespace: sys, name: api.PublicKeysConfigMapName, allowed: true},
			{verb: "patch", resource: "configmaps", namespace: sys, name: api.PublicKeysConfigMapName, allowed: true},
			{verb: "patch", resource: "configmaps", namespace: sys, name: "dynamig-device-config"},
		},
		cluster.UserDevicePlugin: {
			{verb: "list", resource: "pods", allowed: true},
			{verb: "watch", resource: "pods", allowed: true},
			{verb: "get", resource: "pods", namespace: "team-a", allowed: true},
			{verb: "patch", resource: "pods", namespace: "team-a", allowed: true},
			{verb: "get", resource: "nodes", allowed: true},
			{verb: "patch", resource: "nodes", allowed: true},
			{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: sys, allowed: true},
			{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: sys, allowed: true},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: sys, allowed: true},
			// It says in events why a pod's reservation can never be realised; it evicts
			// nothing (the scheduler evicts the pods it marks failed): an eviction right
			// could not be narrowed to its own node.
			{verb: "create", resource: "pods", subresource: "eviction", namespace: "team-a"},
			{verb: "create", resource: "events", namespace: "team-a", allowed: true},
			{verb: "patch", resource: "events", namespace: "team-a", allowed: true},
			{verb: "create", group: "events.k8s.io", resource: "events", namespace: "team-a", allowed: true},
			{verb: "patch", group: "events.k8s.io", resource: "events", namespace: "team-a", allowed: true},
			{verb: "delete", resource: "events", namespace: "team-a"},
			{verb: "create", resource: "pods", subresource: "binding", namespace: "team-a"},
			{verb: "create", resource: "pods", namespace: "team-a"},
			{verb: "delete", resource: "pods", namespace: "team-a"},
			{verb: "update", resource: "nodes", subresource: "status"},
			{verb: "delete", group: "coordination.k8s.io", resource: "leases", namespace: sys},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease"},
			{verb: "list", resource: "secrets", namespace: sys},
			{verb: "get", resource: "secrets", namespace: sys, name: "dynamig-webhook-cert"},
			{verb: "get", resource: "secrets", namespace: "team-a", name: "any"},
			{verb: "get", resource: "configmaps", namespace: sys, name: api.PublicKeysConfigMapName, allowed: true},
			{verb: "list", resource: "configmaps", namespace: sys, name: api.PublicKeysConfigMapName, allowed: true},
			{verb: "watch", resource: "configmaps", namespace: sys, name: api.PublicKeysConfigMapName, allowed: true},
			{verb: "patch", resource: "configmaps", namespace: sys, name: api.PublicKeysConfigMapName},
			{verb: "list", resource: "configmaps", namespace: sys},
			{verb: "get", resource: "secrets", namespace: signingNS, name: api.SigningKeySecretName},
		},
		cluster.UserWebhook: {
			{verb: "list", resource: "secrets", namespace: sys, allowed: true},
			{verb: "watch", resource: "secrets", namespace: sys, allowed: true},
			{verb: "get", resource: "secrets", namespace: sys, name: "dynamig-webhook-cert", allowed: true},
			{verb: "update", resource: "secrets", namespace: sys, name: "dynamig-webhook-cert", allowed: true},
			{verb: "watch", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", allowed: true},
			{verb: "update", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: "dynamig-webhook", allowed: true},
			{verb: "update", resource: "secrets", namespace: sys, name: "other"},
			{verb: "get", resource: "secrets", namespace: "team-a", name: "dynamig-webhook-cert"},
			{verb: "list", resource: "secrets", namespace: "team-a"},
			{verb: "update", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: "other"},
			{verb: "update", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "dynamig-webhook"},
			{verb: "get", resource: "pods", namespace: "team-a"},
			{verb: "patch", resource: "pods", namespace: "team-a"},
			{verb: "list", resource: "secrets", namespace: signingNS},
			{verb: "get", resource: "secrets", namespace: signingNS, name: api.SigningKeySecretName},
		},
	}
	for user, checks := range cases {
		for _, c := range checks {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   user,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + sys, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: c.verb, Group: c.group, Resource: c.resource, Subresource: c.subresource, Namespace: c.namespace, Name: c.name},
			}}
			got, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.Allowed != c.allowed {
				t.Errorf("%s: %s %s/%s %s in %q name %q: allowed %v, want %v (%s)", user, c.verb, c.resource, c.subresource, c.group, c.namespace, c.name,
					got.Status.Allowed, c.allowed, got.Status.Reason)
			}
		}
	}
}

// applyRBAC creates the manifest's namespaces, service accounts and RBAC, as the admin (the
// release namespace exists already: test/cluster creates it).
func applyRBAC(ctx context.Context, t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	for _, obj := range installObjects(t) {
		var err error
		co := metav1.CreateOptions{}
		switch o := obj.(type) {
		case *v1.Namespace:
			_, err = admin.CoreV1().Namespaces().Create(ctx, o, co)
			if apierrors.IsAlreadyExists(err) {
				err = nil
			}
		case *v1.ServiceAccount:
			_, err = admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, co)
		case *rbacv1.ClusterRole:
			_, err = admin.RbacV1().ClusterRoles().Create(ctx, o, co)
		case *rbacv1.ClusterRoleBinding:
			_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, o, co)
		case *rbacv1.Role:
			_, err = admin.RbacV1().Roles(o.Namespace).Create(ctx, o, co)
		case *rbacv1.RoleBinding:
			_, err = admin.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, co)
		}
		if err != nil {
			t.Fatalf("creating %T: %v", obj, err)
		}
	}
}

// identity is a client of the chart's service account sa with a token the API server issued
// bound to a pod of that account, on node ("" for an unscheduled pod), as the pod's
// projected token is in a cluster.
func identity(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, admin kubernetes.Interface, sa, node string) kubernetes.Interface {
	t.Helper()
	name := sa
	if node != "" {
		name += "-" + node
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: api.DefaultSystemNamespace},
		Spec: v1.PodSpec{ServiceAccountName: sa, NodeName: node, Containers: []v1.Container{{Name: "c", Image: "dynamig/" + sa}}}}
	pod, err := admin.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token, err := cluster.ServiceAccountToken(ctx, admin, pod, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cp.TokenConfig(token, name))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// nodelessIdentity is a client of service account sa with a token bound to no pod (as a
// TokenRequest without a bound object, or a legacy Secret token, gives): no node in it.
func nodelessIdentity(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, admin kubernetes.Interface, sa string) kubernetes.Interface {
	t.Helper()
	tr, err := admin.CoreV1().ServiceAccounts(api.DefaultSystemNamespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cp.TokenConfig(tr.Status.Token, sa+"-nodeless"))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
