package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/dynamig/dynamig/manifests"
)

// DecodeManifest decodes a YAML stream of Kubernetes objects (documents separated by ---)
// into typed objects; documents holding only comments are skipped, and an error names the
// document.
func DecodeManifest(data []byte) ([]runtime.Object, error) {
	objs, err := manifests.Objects(data)
	if err != nil {
		return nil, err
	}
	out := make([]runtime.Object, 0, len(objs))
	for _, u := range objs {
		raw, err := u.MarshalJSON()
		if err != nil {
			return nil, err
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
		out = append(out, obj)
	}
	return out, nil
}

// Apply server-side applies objs through cfg's identity, as `kubectl apply --server-side`
// does, in their order (namespaces and RBAC before what uses them: the order Helm renders).
func Apply(ctx context.Context, cfg *rest.Config, fieldManager string, objs []*unstructured.Unstructured) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
			return fmt.Errorf("applying %s %s/%s: %w", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
	return nil
}

// ServiceAccountToken asks the API server for a token of pod's service account bound to the
// pod (a TokenRequest with a boundObjectRef), as the kubelet does for a pod's projected
// token: the API server authenticates it as system:serviceaccount:<namespace>:<name>, with
// the pod and, for a pod bound to a node, the node in the user's extra
// (authentication.kubernetes.io/node-name), for as long as the pod exists.
func ServiceAccountToken(ctx context.Context, client kubernetes.Interface, pod *v1.Pod, expiration time.Duration) (string, error) {
	seconds := int64(expiration / time.Second)
	tr, err := client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &seconds,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of service account %s/%s for pod %s: %w", pod.Namespace, pod.Spec.ServiceAccountName, pod.Name, err)
	}
	return tr.Status.Token, nil
}

// DecodePods decodes the Pods of a YAML stream (documents separated by ---). Any other
// kind is an error naming it.
func DecodePods(data []byte) ([]*v1.Pod, error) {
	objs, err := DecodeManifest(data)
	if err != nil {
		return nil, err
	}
	out := make([]*v1.Pod, len(objs))
	for i, obj := range objs {
		p, ok := obj.(*v1.Pod)
		if !ok {
			return nil, fmt.Errorf("object %d: a %T, not a Pod", i+1, obj)
		}
		out[i] = p
	}
	return out, nil
}

// ReadPods reads the Pods of every *.yaml and *.yml file in dir, in file name order.
func ReadPods(dir string) ([]*v1.Pod, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []*v1.Pod
	for _, e := range entries {
		if e.IsDir() || !(strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		pods, err := DecodePods(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, pods...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no Pods in *.yaml files", dir)
	}
	return out, nil
}
