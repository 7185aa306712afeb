package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// gatewayScrapeTimeout bounds one read of the gateway's metrics.
const gatewayScrapeTimeout = 2 * time.Second

// gatewayCollector re-exposes the gateway plugin's metrics on berthd's
// /metrics (docs/plugins.md section 5.5): at every scrape it reads the
// gateway's own /metrics over the unix socket the gateway serves in its
// state directory and hands the berth_gateway_* families on unchanged. A
// gateway that does not answer costs only its families in that scrape
// (logged at debug). It is an unchecked collector: the families exist only
// once the gateway has counted something.
type gatewayCollector struct {
	socket string
	client *http.Client
	log    *slog.Logger
}

var _ prometheus.Collector = (*gatewayCollector)(nil)

func newGatewayCollector(socket string, log *slog.Logger) *gatewayCollector {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns: 1,
	}
	return &gatewayCollector{socket: socket, client: &http.Client{Transport: tr, Timeout: gatewayScrapeTimeout}, log: log}
}

// Describe implements prometheus.Collector: nothing, as an unchecked collector.
func (c *gatewayCollector) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector.
func (c *gatewayCollector) Collect(ch chan<- prometheus.Metric) {
	fams, err := c.scrape()
	if err != nil {
		c.log.Debug("gateway metrics not read", "socket", c.socket, "error", err)
		return
	}
	names := make([]string, 0, len(fams))
	for n := range fams {
		if strings.HasPrefix(n, "berth_gateway_") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		if err := emitFamily(ch, fams[n]); err != nil {
			c.log.Warn("gateway metric family not re-exposed", "family", n, "error", err)
		}
	}
}

func (c *gatewayCollector) scrape() (map[string]*dto.MetricFamily, error) {
	resp, err := c.client.Get("http://gateway/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("gateway metrics answered %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	return p.TextToMetricFamilies(resp.Body)
}

// emitFamily sends every sample of f as a constant metric.
func emitFamily(ch chan<- prometheus.Metric, f *dto.MetricFamily) error {
	for _, m := range f.GetMetric() {
		names := make([]string, 0, len(m.GetLabel()))
		values := make([]string, 0, len(m.GetLabel()))
		for _, l := range m.GetLabel() {
			names = append(names, l.GetName())
			values = append(values, l.GetValue())
		}
		desc := prometheus.NewDesc(f.GetName(), f.GetHelp(), names, nil)
		var (
			pm  prometheus.Metric
			err error
		)
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			pm, err = prometheus.NewConstMetric(desc, prometheus.CounterValue, m.GetCounter().GetValue(), values...)
		case dto.MetricType_GAUGE:
			pm, err = prometheus.NewConstMetric(desc, prometheus.GaugeValue, m.GetGauge().GetValue(), values...)
		case dto.MetricType_HISTOGRAM:
			h := m.GetHistogram()
			buckets := make(map[float64]uint64, len(h.GetBucket()))
			for _, b := range h.GetBucket() {
				buckets[b.GetUpperBound()] = b.GetCumulativeCount()
			}
			pm, err = prometheus.NewConstHistogram(desc, h.GetSampleCount(), h.GetSampleSum(), buckets, values...)
		default:
			pm, err = prometheus.NewConstMetric(desc, prometheus.UntypedValue, m.GetUntyped().GetValue(), values...)
		}
		if err != nil {
			return err
		}
		ch <- pm
	}
	return nil
}
