// Package podresources asks the kubelet which pod and container hold a set of device IDs,
// through its PodResources API (v1 List) on <kubelet root>/pod-resources/kubelet.sock. The
// kubelet, which assigned the IDs, is the one that knows: by the time it calls
// PreStartContainer, the container is listed with exactly those IDs. It lists active pods'
// regular containers and sidecars, never plain init containers.
package podresources

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultSocket is the kubelet's PodResources socket under its default root directory.
const DefaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Owner is the container that holds devices.
type Owner struct {
	Namespace, Pod, Container string
}

func (o Owner) String() string { return o.Namespace + "/" + o.Pod + " container " + o.Container }

// Client talks to one kubelet's PodResources API.
type Client struct {
	conn   *grpc.ClientConn
	lister podresourcesv1.PodResourcesListerClient
}

// Dial connects to the socket (lazily: the first call dials).
func Dial(socket string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("PodResources socket %s: %w", socket, err)
	}
	return &Client{conn: conn, lister: podresourcesv1.NewPodResourcesListerClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Find returns the one container that holds exactly deviceIDs of resource. None, or more
// than one, is an error that says what the kubelet lists.
func (c *Client) Find(ctx context.Context, resource string, deviceIDs []string) (Owner, error) {
	resp, err := c.lister.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return Owner{}, fmt.Errorf("listing the kubelet's pod resources: %w", err)
	}
	return owner(resp, resource, deviceIDs)
}

// Held returns the IDs of resource's devices that the kubelet's listed containers hold.
func (c *Client) Held(ctx context.Context, resource string) (map[string]bool, error) {
	resp, err := c.lister.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing the kubelet's pod resources: %w", err)
	}
	return held(resp, resource), nil
}

func held(resp *podresourcesv1.ListPodResourcesResponse, resource string) map[string]bool {
	ids := map[string]bool{}
	for _, p := range resp.GetPodResources() {
		for _, ctr := range p.GetContainers() {
			for _, d := range ctr.GetDevices() {
				if d.GetResourceName() == resource {
					for _, id := range d.GetDeviceIds() {
						ids[id] = true
					}
				}
			}
		}
	}
	return ids
}

// owner finds in the kubelet's answer the one container that holds exactly deviceIDs.
func owner(resp *podresourcesv1.ListPodResourcesResponse, resource string, deviceIDs []string) (Owner, error) {
	want := slices.Sorted(slices.Values(deviceIDs))
	var found []Owner
	for _, p := range resp.GetPodResources() {
		for _, ctr := range p.GetContainers() {
			var ids []string
			for _, d := range ctr.GetDevices() {
				if d.GetResourceName() == resource {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
			slices.Sort(ids)
			if slices.Equal(ids, want) {
				found = append(found, Owner{Namespace: p.GetNamespace(), Pod: p.GetName(), Container: ctr.GetName()})
			}
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return Owner{}, fmt.Errorf("no active container holds %s devices [%s] (the kubelet lists regular containers and sidecars, not plain init containers)",
			resource, strings.Join(want, " "))
	default:
		var names []string
		for _, o := range found {
			names = append(names, o.String())
		}
		return Owner{}, fmt.Errorf("%s devices [%s] are held by %d containers (%s); refusing to guess", resource, strings.Join(want, " "), len(found), strings.Join(names, ", "))
	}
}
