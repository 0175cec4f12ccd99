// Package metrics checks what is written about dynamig's metrics against what the components
// register: docs/metrics.md lists every metric with its labels, and every query of the
// Grafana dashboard the chart ships names metrics and labels that exist.
package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	devicemetrics "github.com/dynamig/dynamig/deviceplugin/metrics"
	"github.com/dynamig/dynamig/plugins/dynamicmig"
	"github.com/dynamig/dynamig/test/metricsdoc"
)

const (
	docsFile      = "../../docs/metrics.md"
	dashboardFile = "../../manifests/charts/dynamig/dashboards/dynamig.json"
)

// metric is one registered metric: its labels, variable and constant, and whether the
// device plugin serves it.
type metric struct {
	labels       []string
	devicePlugin bool
}

var (
	descName   = regexp.MustCompile(`fqName: "([^"]+)"`)
	descConst  = regexp.MustCompile(`constLabels: \{([^}]*)\}`)
	descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
)

// exported is every metric the scheduler's and the device plugin's registries describe,
// including those with no series yet.
func exported(t *testing.T) map[string]metric {
	t.Helper()
	out := map[string]metric{}
	for _, r := range []struct {
		registry     *prometheus.Registry
		devicePlugin bool
	}{{dynamicmig.Registry, false}, {devicemetrics.Registry, true}} {
		ch := make(chan *prometheus.Desc)
		go func() {
			r.registry.Describe(ch)
			close(ch)
		}()
		for d := range ch {
			// A Desc shows its name and labels only through String.
			s := d.String()
			name, vars, consts := descName.FindStringSubmatch(s), descLabels.FindStringSubmatch(s), descConst.FindStringSubmatch(s)
			if name == nil || vars == nil || consts == nil {
				t.Fatalf("cannot read the metric description %s", s)
			}
			m := metric{devicePlugin: r.devicePlugin}
			for _, l := range strings.Split(vars[1], ",") {
				if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
					m.labels = append(m.labels, l)
				}
			}
			for _, l := range strings.Split(consts[1], ",") {
				if n, _, ok := strings.Cut(l, "="); ok {
					m.labels = append(m.labels, n)
				}
			}
			out[name[1]] = m
		}
	}
	if len(out) < 8 {
		t.Fatalf("only %d metrics registered: %v", len(out), out)
	}
	return out
}

// docRow is one row of a metrics table in docs/metrics.md (columns metric, type, labels, …).
type docRow struct {
	kind, labels string
	section      string
}

// documented reads the metrics tables of docs/metrics.md by metric name.
func documented(t *testing.T) map[string]docRow {
	t.Helper()
	raw, err := os.ReadFile(docsFile)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]docRow{}
	section, inTable := "", false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "## ") {
			section = strings.TrimPrefix(line, "## ")
		}
		if !strings.HasPrefix(line, "|") {
			inTable = false
			continue
		}
		c := metricsdoc.Cells(line)
		if len(c) >= 3 && c[0] == "metric" && c[1] == "type" && c[2] == "labels" {
			inTable = true
			continue
		}
		if !inTable || len(c) < 3 || strings.HasPrefix(c[0], "---") {
			continue
		}
		name := strings.Trim(c[0], "`")
		if _, dup := out[name]; dup {
			t.Errorf("%s: %s has two rows", docsFile, name)
		}
		out[name] = docRow{kind: c[1], labels: c[2], section: section}
	}
	return out
}

// TestDocsListEveryMetric: docs/metrics.md has a row for every registered metric, naming
// each of its labels, and no row for a metric dynamig's registries do not have (the
// webhook's are controller-runtime's).
func TestDocsListEveryMetric(t *testing.T) {
	docs, metrics := documented(t), exported(t)
	for name, m := range metrics {
		row, ok := docs[name]
		if !ok {
			t.Errorf("%s lists no %s", docsFile, name)
			continue
		}
		for _, l := range m.labels {
			if !strings.Contains(row.labels, "`"+l+"`") && !strings.Contains(row.labels, "`"+l+"=") {
				t.Errorf("%s: the row of %s does not name its label %s", docsFile, name, l)
			}
		}
	}
	for name, row := range docs {
		if _, ok := metrics[name]; !ok && !strings.HasPrefix(row.section, "Webhook") {
			t.Errorf("%s lists %s, which no dynamig registry has", docsFile, name)
		}
	}
}

// TestHAMiTable: each series the HAMi mapping table says dynamig exports is described by the
// registry of the file it names (collector.go: the scheduler's; metrics.go: the device
// plugin's) with exactly the row's labels and zone; a series it says is not exported is
// in neither registry; and every series of HAMi's that the registries describe (every one
// not named dynamig_*) has its row. test/metricsdoc's CheckScraped, called by the scheduler's
// and the device plugin's tests, then finds each exported row in a scrape.
func TestHAMiTable(t *testing.T) {
	metrics := exported(t)
	rows := map[string]bool{}
	for _, row := range metricsdoc.HAMiTable(t) {
		if rows[row.Name] {
			t.Errorf("%s: %s has two rows in the HAMi table", docsFile, row.Name)
		}
		rows[row.Name] = true
		m, ok := metrics[row.Name]
		switch {
		case row.DefinedIn == "":
			if ok {
				t.Errorf("%s: the HAMi table says %s is not exported, but a registry describes it", docsFile, row.Name)
			}
			continue
		case !ok:
			t.Errorf("%s: the HAMi table says %s is exported, and no registry describes it", docsFile, row.Name)
			continue
		case row.DefinedIn != metricsdoc.SchedulerFile && row.DefinedIn != metricsdoc.DevicePluginFile:
			t.Errorf("%s: %s is defined in %s, which is neither %s nor %s", docsFile, row.Name, row.DefinedIn, metricsdoc.SchedulerFile, metricsdoc.DevicePluginFile)
		case m.devicePlugin != (row.DefinedIn == metricsdoc.DevicePluginFile):
			t.Errorf("%s: the HAMi table says %s is defined in %s, which is not the registry that describes it", docsFile, row.Name, row.DefinedIn)
		}
		want := append(slices.Clone(row.Labels), metricsdoc.Zone[0])
		got := slices.Clone(m.labels)
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: the HAMi table gives %s the labels %v (and zone); its description has %v", docsFile, row.Name, row.Labels, got)
		}
	}
	for name := range metrics {
		if !strings.HasPrefix(name, "dynamig_") && !rows[name] {
			t.Errorf("%s: %s is HAMi's series, and the HAMi table has no row of it", docsFile, name)
		}
	}
}

// Labels a series gets from its scrape rather than from dynamig: Prometheus' target labels,
// prometheus-operator's, and the device plugins' node, which the chart's ServiceMonitor adds.
var scrapeLabels = []string{"instance", "job", "namespace", "pod", "service", "endpoint", "container"}

// histogramSeries are the series names of a histogram's samples.
var histogramSeries = []string{"_bucket", "_sum", "_count"}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

var labelValues = regexp.MustCompile(`^label_values\((.*),\s*(\w+)\)$`)

// TestDashboardQueries: every query of the dashboard (panel targets and template variables)
// names only registered metrics, with labels they have.
func TestDashboardQueries(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	metrics, docs := exported(t), documented(t)
	check := func(where, expr, extraLabel string) {
		sels, err := selectors(expr)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			return
		}
		if len(sels) == 0 {
			t.Errorf("%s: no metric in %q", where, expr)
		}
		for _, sel := range sels {
			name, labels := sel.name, sel.labels
			if extraLabel != "" {
				labels = append(labels, extraLabel)
			}
			m, ok := metrics[name]
			if !ok {
				for _, suffix := range histogramSeries {
					if base, cut := strings.CutSuffix(name, suffix); cut && docs[base].kind == "histogram" {
						m, ok = metrics[base]
						if suffix == "_bucket" {
							m.labels = append(slices.Clone(m.labels), "le")
						}
					}
				}
			}
			if !ok {
				t.Errorf("%s: %s is not a metric dynamig exports (%q)", where, name, expr)
				continue
			}
			for _, l := range labels {
				if !slices.Contains(m.labels, l) && !slices.Contains(scrapeLabels, l) && !(m.devicePlugin && l == "node") {
					t.Errorf("%s: %s has no label %s (%q)", where, name, l, expr)
				}
			}
		}
	}
	var walk func([]panel)
	queries := 0
	walk = func(panels []panel) {
		for _, p := range panels {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
				t.Errorf("panel %q: want targets on the datasource variable", p.Title)
			}
			for _, tg := range p.Targets {
				check("panel "+p.Title, tg.Expr, "")
				queries++
			}
		}
	}
	walk(d.Panels)
	variables := map[string]string{}
	for _, v := range d.Templating.List {
		variables[v.Name] = v.Type
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Fatalf("variable %s: query %s", v.Name, v.Query)
			}
		}
		if m := labelValues.FindStringSubmatch(q.Query); m != nil {
			check("variable "+v.Name, m[1], m[2])
		} else {
			check("variable "+v.Name, q.Query, "")
		}
		queries++
	}
	if variables["datasource"] != "datasource" || variables["node"] != "query" {
		t.Errorf("want the variables datasource (a data source) and node (a query): %v", variables)
	}
	if queries < 10 {
		t.Errorf("only %d queries found in %s", queries, dashboardFile)
	}
}

func TestSelectors(t *testing.T) {
	for expr, want := range map[string][]selector{
		`histogram_quantile(0.95, sum by (le) (rate(a_bucket{x="1", y=~"$node"}[$__rate_interval])))`: {{"a_bucket", []string{"x", "y"}}},
		`max by (reason) (b) > 0 or vector(0)`:                                                        {{"b", nil}},
		`sum(c{m="a,}b"} - ignoring (k) group_left (z) d) / count without (n) (e offset 5m)`:          {{"c", []string{"m"}}, {"d", nil}, {"e", nil}},
		`label_replace(f, "UUID", "$1", "device_uuid", "(.*)") * on (UUID) g:rule{h!~'x'}`:            {{"f", nil}, {"g:rule", []string{"h"}}},
		`rate(i[5m:1m]) * 1e3 + .5 - topk(3, j)`:                                                      {{"i", nil}, {"j", nil}},
	} {
		got, err := selectors(expr)
		if err != nil || !slices.EqualFunc(got, want, func(a, b selector) bool { return a.name == b.name && slices.Equal(a.labels, b.labels) }) {
			t.Errorf("selectors(%q) = %v, %v; want %v", expr, got, err, want)
		}
	}
	for _, bad := range []string{`{__name__="x"}`, `a{b="c"`, `a{b}`, `sum(a{b="c})`} {
		if _, err := selectors(bad); err == nil {
			t.Errorf("selectors(%q) must fail", bad)
		}
	}
}
