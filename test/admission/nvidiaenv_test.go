package admission

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/api"
)

// testNvidiaEnv: no tenant container sets NVIDIA_VISIBLE_DEVICES or NVIDIA_MIG_* (the policy
// dynamig-nvidia-env), in any container kind, literally or from a reference, at creation or
// in an ephemeral container added later; the release namespace (the device plugin's own
// DaemonSet) may.
func testNvidiaEnv(ctx context.Context, t *testing.T, c clients) {
	withEnv := func(name string, env v1.EnvVar, init bool) *v1.Pod {
		p := cpuPod(name, "other-scheduler", "")
		if init {
			p.Spec.InitContainers = []v1.Container{{Name: "init", Image: "busybox", Env: []v1.EnvVar{env}}}
		} else {
			p.Spec.Containers[0].Env = []v1.EnvVar{{Name: "OTHER", Value: "x"}, env}
		}
		return p
	}
	fromConfigMap := &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "gpus"}, Key: "all"}}
	for _, tc := range []struct {
		name      string
		pod       *v1.Pod
		container string
	}{
		{"all GPUs, literally", withEnv("env-all", v1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}, false), "c"},
		{"another pod's MIG device", withEnv("env-mig", v1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "MIG-0a1b2c3d-0000-0000-0000-000000000000"}, false), "c"},
		{"from a ConfigMap", withEnv("env-ref", v1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", ValueFrom: fromConfigMap}, false), "c"},
		{"MIG config devices in an init container", withEnv("env-init", v1.EnvVar{Name: "NVIDIA_MIG_CONFIG_DEVICES", Value: "all"}, true), "init"},
		{"a GPU pod adding all GPUs", func() *v1.Pod {
			p := gpuPod("env-gpu", dynamigSched)
			p.Spec.Containers[0].Env = []v1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
			return p
		}(), "c"},
	} {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			_, err := c.admin.CoreV1().Pods(ns).Create(ctx, tc.pod, metav1.CreateOptions{})
			want := "container " + tc.container + " sets NVIDIA_VISIBLE_DEVICES or NVIDIA_MIG_* in its env"
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "dynamig-nvidia-env") || !strings.Contains(err.Error(), want) {
				t.Fatalf("want a refusal saying %q, got %v", want, err)
			}
		})
	}
	t.Run("refused/an ephemeral container added later", func(t *testing.T) {
		p := createPod(ctx, t, c.admin, cpuPod("env-ephemeral", "other-scheduler", ""))
		p.Spec.EphemeralContainers = []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{
			Name: "debug", Image: "busybox", Env: []v1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}}}}
		_, err := c.admin.CoreV1().Pods(ns).UpdateEphemeralContainers(ctx, p.Name, p, metav1.UpdateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "container debug sets NVIDIA_VISIBLE_DEVICES") {
			t.Fatalf("want a refusal, got %v", err)
		}
	})
	t.Run("allowed", func(t *testing.T) {
		other := withEnv("env-other", v1.EnvVar{Name: "CUDA_VISIBLE_DEVICES", Value: "0"}, false)
		if _, err := c.admin.CoreV1().Pods(ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
			t.Errorf("CUDA_VISIBLE_DEVICES only masks what the container was given: %v", err)
		}
		plugin := withEnv("env-device-plugin", v1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}, false)
		plugin.Namespace = api.DefaultSystemNamespace
		if _, err := c.admin.CoreV1().Pods(plugin.Namespace).Create(ctx, plugin, metav1.CreateOptions{}); err != nil {
			t.Errorf("the release namespace (the device plugin's DaemonSet): %v", err)
		}
	})
}
