package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/dynamig/dynamig/api"
)

// Instance is a MIG instance as a device plugin reports it (dynamig_mig_instance), with
// the pod it was made for (empty when dynamig did not make it).
type Instance struct {
	GPUUUID           string
	Profile           string
	Placement         api.Placement
	GPUInstanceID     int
	ComputeInstanceID int
	PodNamespace      string
	PodName           string
}

func (in Instance) String() string {
	owner := "(not dynamig's)"
	if in.PodName != "" {
		owner = in.PodNamespace + "/" + in.PodName
	}
	return fmt.Sprintf("%s %s %s gi=%d ci=%d %s", in.GPUUUID, in.Profile, in.Placement, in.GPUInstanceID, in.ComputeInstanceID, owner)
}

// Scrape reads the metric families a Prometheus endpoint at url serves.
func Scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return families, nil
}

// Labels are the label pairs of a sample, by name.
func Labels(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, lp := range m.GetLabel() {
		l[lp.GetName()] = lp.GetValue()
	}
	return l
}

// ScrapeInstances reads the MIG instances a device plugin's /metrics at url reports
// (dynamig_mig_instance, which lists what NVML reports), sorted by GPU and placement.
func ScrapeInstances(ctx context.Context, url string) ([]Instance, error) {
	families, err := Scrape(ctx, url)
	if err != nil {
		return nil, err
	}
	var out []Instance
	if mf := families["dynamig_mig_instance"]; mf != nil {
		for _, m := range mf.GetMetric() {
			l := Labels(m)
			in := Instance{GPUUUID: l["gpu_uuid"], Profile: l["profile"], PodNamespace: l["pod_namespace"], PodName: l["pod_name"]}
			for _, f := range []struct {
				label string
				to    *int
			}{{"placement_start", &in.Placement.Start}, {"placement_size", &in.Placement.Size},
				{"gpu_instance_id", &in.GPUInstanceID}, {"compute_instance_id", &in.ComputeInstanceID}} {
				if *f.to, err = strconv.Atoi(l[f.label]); err != nil {
					return nil, fmt.Errorf("dynamig_mig_instance: label %s=%q: %w", f.label, l[f.label], err)
				}
			}
			out = append(out, in)
		}
	}
	slices.SortFunc(out, func(a, b Instance) int {
		if c := strings.Compare(a.GPUUUID, b.GPUUUID); c != 0 {
			return c
		}
		return a.Placement.Start - b.Placement.Start
	})
	return out, nil
}
