package realcluster

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/probe/report"
)

func TestMain(m *testing.M) { Main(m) }

// TestChart installs the chart with Helm's SDK into a cluster of two GPU nodes on containerd
// and runc, then checks from inside the containers.
func TestChart(t *testing.T) {
	start := time.Now()
	c := Start(t, Options{Nodes: []string{"n1", "n2"}})
	t.Logf("cluster up, dynamig installed and ready in %s", time.Since(start).Round(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("components run as pods", func(t *testing.T) {
		for _, tc := range []struct {
			prefix, serviceAccount, image string
			want                          int
		}{
			{"dynamig-scheduler-", "dynamig-scheduler", "dynamig-scheduler", 1},
			{"dynamig-webhook-", "dynamig-webhook", "dynamig-webhook", 1},
			{"dynamig-device-plugin-", "dynamig-device-plugin", "dynamig-device-plugin", len(c.Nodes)},
		} {
			pods, err := c.Pods(ctx, tc.prefix)
			if err != nil {
				t.Fatal(err)
			}
			if len(pods) != tc.want {
				t.Errorf("%s*: %d pods, want %d", tc.prefix, len(pods), tc.want)
			}
			for _, p := range pods {
				if p.Status.Phase != v1.PodRunning || !ready(&p) {
					t.Errorf("pod %s: %s, not Ready", p.Name, p.Status.Phase)
				}
				if p.Spec.ServiceAccountName != tc.serviceAccount {
					t.Errorf("pod %s runs as service account %q, want %q", p.Name, p.Spec.ServiceAccountName, tc.serviceAccount)
				}
				if img := p.Spec.Containers[0].Image; !strings.HasPrefix(img, Registry+"/dynamig/"+tc.image+":") {
					t.Errorf("pod %s runs image %s", p.Name, img)
				}
				for _, cs := range p.Status.ContainerStatuses {
					if cs.RestartCount != 0 {
						t.Errorf("pod %s: container %s restarted %d times", p.Name, cs.Name, cs.RestartCount)
					}
				}
			}
		}
	})

	t.Run("seed example, seen from inside", func(t *testing.T) {
		raw, err := os.ReadFile("../../examples/gpu-pod1.yaml")
		if err != nil {
			t.Fatal(err)
		}
		pods, err := cluster.DecodePods(raw)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			p.Namespace = metav1.NamespaceDefault
			if _, err := c.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range pods {
			c.seesOwnDevices(t, ctx, p.Namespace, p.Name)
		}
	})
}

func ready(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// seesOwnDevices waits until the pod runs with its MIG reservations realised, then checks
// that each container's own program reports exactly the MIG UUIDs of its reservations in
// NVIDIA_VISIBLE_DEVICES, and nothing else of a GPU.
func (c *Cluster) seesOwnDevices(t *testing.T, ctx context.Context, namespace, name string) {
	t.Helper()
	var pod *v1.Pod
	var recs []api.MigReservation
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		if p.Status.Phase != v1.PodRunning {
			return false, nil
		}
		recs, err = api.DecodeMigReservations(p.Annotations[api.MigReservationsAnnotation])
		if err != nil || len(recs) == 0 {
			return false, nil
		}
		for _, r := range recs {
			if !r.Realized() {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s did not run with realised reservations: %v\n%s", namespace, name, err, c.Describe(ctx))
	}
	node := c.Nodes[pod.Spec.NodeName]
	for i, ctr := range pod.Spec.Containers {
		var want []string
		for _, r := range recs {
			if r.ContainerIndex == len(pod.Spec.InitContainers)+i {
				want = append(want, r.MigUUID)
			}
		}
		var got report.Report
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			got, err = node.ProbeReport(pod, ctr.Name)
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("pod %s container %s: no report: %v", name, ctr.Name, err)
		}
		seen := strings.Split(got.Env["NVIDIA_VISIBLE_DEVICES"], ",")
		slices.Sort(seen)
		slices.Sort(want)
		if !slices.Equal(seen, want) {
			t.Errorf("pod %s container %s sees NVIDIA_VISIBLE_DEVICES=%q, want its reservations' %v", name, ctr.Name, got.Env["NVIDIA_VISIBLE_DEVICES"], want)
		}
		if len(got.Devices) != 0 {
			t.Errorf("pod %s container %s sees device nodes %v (deviceEdits env gives none)", name, ctr.Name, got.Devices)
		}
		t.Logf("pod %s container %s sees %s", name, ctr.Name, fmt.Sprint(got.Env))
	}
}
