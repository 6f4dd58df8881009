package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	_ "github.com/holdfast/holdfast/algorithms" // registers the built-in algorithms
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/httplimit"
)

// document is the top level of a config file. Policies stay YAML nodes:
// they are read field by field so every error can name its policy.
type document struct {
	Prefix   string
	IP       httplimit.IPOptions // client_ip, with trust_proxy
	Policies []*yaml.Node

	trustedProxies bool // client_ip's trusted_proxies was given
}

// The shapes of an algorithm's numbers: a rate (driver.RateAlgorithm) or a
// limit per window (driver.WindowAlgorithm).
const (
	rateShape   = "rate"
	windowShape = "window"
)

// fields maps each policy field to the shape of the algorithms it belongs
// to; "" means every algorithm.
var fields = map[string]string{
	"name": "", "path": "", "algorithm": "", "key": "", "outage": "",
	"capacity": rateShape, "refill_per_second": rateShape,
	"limit": windowShape, "window": windowShape,
}

// shapeOf returns the shape of alg's numbers, "" when it has none a config
// can give.
func shapeOf(alg driver.Algorithm) string {
	switch alg.(type) {
	case driver.RateAlgorithm:
		return rateShape
	case driver.WindowAlgorithm:
		return windowShape
	}
	return ""
}

// namesOf returns the registered algorithms of the given shape, as "a or b".
func namesOf(shape string) string {
	var names []string
	for _, n := range driver.AlgorithmNames() {
		if alg, _ := driver.AlgorithmByName(n); shapeOf(alg) == shape {
			names = append(names, n)
		}
	}
	return strings.Join(names, " or ")
}

// Load reads a config (at most MaxSize bytes, one YAML document) and
// validates it. Errors about a policy are *FieldError.
func Load(r io.Reader) (*Config, error) {
	src, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(src) > MaxSize {
		return nil, fmt.Errorf("config: larger than %d bytes", MaxSize)
	}
	doc, err := decode(src)
	if err != nil {
		return nil, err
	}
	c := &Config{Prefix: doc.Prefix}
	for i := range doc.Policies {
		p, err := parsePolicy(i, doc.Policies[i], doc.IP)
		if err != nil {
			return nil, err
		}
		c.Policies = append(c.Policies, p)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// decode parses exactly one YAML document and reads its top level.
func decode(src []byte) (doc document, err error) {
	defer func() {
		// The YAML library is the first reader of outside input: a panic in
		// it must not take the service down.
		if p := recover(); p != nil {
			err = fmt.Errorf("config: malformed YAML: %v", p)
		}
	}()
	// Decoding into a yaml.Node keeps every field for the walk below, which
	// rejects unknown fields itself (Decoder.KnownFields only applies to
	// structs) so that its errors can name the policy.
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return doc, &FieldError{Index: -1, Field: "policies", Msg: "empty config, want at least one policy"}
		}
		return doc, yamlError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return doc, errors.New("config: more than one YAML document (a second '---')")
	}
	n := &root
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = deref(n.Content[0])
	}
	if n == nil || isNull(n) {
		return doc, &FieldError{Index: -1, Field: "policies", Msg: "empty config, want at least one policy"}
	}
	if n.Kind != yaml.MappingNode {
		return doc, errors.New("config: want a mapping of prefix, client_ip and policies at the top level")
	}
	return doc, doc.read(n)
}

// read reads the top-level mapping n.
func (doc *document) read(n *yaml.Node) error {
	top := func(field, format string, args ...any) error {
		return &FieldError{Index: -1, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	seen := map[string]bool{}
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := deref(n.Content[j]), deref(n.Content[j+1])
		if k == nil || v == nil || k.Kind != yaml.ScalarNode {
			return errors.New("config: top-level field names must be plain strings")
		}
		if seen[k.Value] {
			return top(k.Value, "given twice")
		}
		seen[k.Value] = true
		switch k.Value {
		case "prefix":
			if v.Kind != yaml.ScalarNode {
				return top("prefix", "want a string")
			}
			if !isNull(v) {
				doc.Prefix = v.Value
			}
		case "trust_proxy": // before client_ip: trusted_proxies 1
			var trust bool
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!bool" || v.Decode(&trust) != nil {
				return top("trust_proxy", "want true or false, got %s", show(v.Value))
			}
			if trust {
				doc.IP.TrustedProxies = 1
			}
		case "client_ip":
			if err := doc.readIP(v); err != nil {
				return err
			}
		case "policies":
			switch {
			case v.Kind == yaml.SequenceNode:
				doc.Policies = v.Content
			case !isNull(v):
				return top("policies", "want a list of policies")
			}
		default:
			return top("", "unknown top-level field %s (want prefix, client_ip or policies)", show(k.Value))
		}
	}
	if seen["trust_proxy"] && doc.trustedProxies {
		return top("trust_proxy", "give client_ip's trusted_proxies instead, not both")
	}
	return nil
}

// readIP reads the client_ip mapping n.
func (doc *document) readIP(n *yaml.Node) error {
	bad := func(field, format string, args ...any) error {
		if field != "" {
			field = ": " + field
		}
		return &FieldError{Index: -1, Field: "client_ip" + field, Msg: fmt.Sprintf(format, args...)}
	}
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return bad("", "want a mapping of trusted_proxies, header, ipv6_prefix and ipv4_prefix")
	}
	seen := map[string]bool{}
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := deref(n.Content[j]), deref(n.Content[j+1])
		if k == nil || v == nil || k.Kind != yaml.ScalarNode {
			return bad("", "field names must be plain strings")
		}
		if seen[k.Value] {
			return bad(k.Value, "given twice")
		}
		seen[k.Value] = true
		var dst *int
		lo, hi := 1, 0
		switch k.Value {
		case "header":
			switch strings.ToLower(v.Value) {
			case "x-forwarded-for":
			case "forwarded":
				doc.IP.Forwarded = true
			default:
				return bad("header", "want x-forwarded-for or forwarded, got %s", show(v.Value))
			}
			continue
		case "trusted_proxies":
			dst, lo, hi = &doc.IP.TrustedProxies, 0, math.MaxInt32
			doc.trustedProxies = true
		case "ipv6_prefix":
			dst, hi = &doc.IP.IPv6Prefix, 128
		case "ipv4_prefix":
			dst, hi = &doc.IP.IPv4Prefix, 32
		default:
			return bad("", "unknown field %s (want trusted_proxies, header, ipv6_prefix or ipv4_prefix)", show(k.Value))
		}
		if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || v.Decode(dst) != nil || *dst < lo || *dst > hi {
			return bad(k.Value, "want an integer from %d to %d, got %s", lo, hi, show(v.Value))
		}
	}
	return nil
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// yamlError is a YAML syntax error, with its line.
func yamlError(err error) error {
	return fmt.Errorf("config: %s", strings.TrimPrefix(err.Error(), "yaml: "))
}

// policyFields is one policy's fields while it is parsed.
type policyFields struct {
	i     int
	name  string
	nodes map[string]*yaml.Node
}

func (pf *policyFields) errorf(field string, cause error, format string, args ...any) error {
	return &FieldError{Policy: pf.name, Index: pf.i, Field: field, Msg: fmt.Sprintf(format, args...), Err: cause}
}

// parsePolicy reads policy i from its YAML mapping.
func parsePolicy(i int, n *yaml.Node, ip httplimit.IPOptions) (Policy, error) {
	pf := &policyFields{i: i, nodes: map[string]*yaml.Node{}}
	n = deref(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return Policy{}, pf.errorf("", nil, "want a mapping of fields (name, path, algorithm, ...)")
	}
	var problem error
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := deref(n.Content[j]), deref(n.Content[j+1])
		switch {
		case problem != nil:
		case k == nil || k.Kind != yaml.ScalarNode:
			problem = pf.errorf("", nil, "field names must be plain strings")
		case pf.nodes[k.Value] != nil:
			problem = pf.errorf(k.Value, nil, "given twice")
		default:
			if _, known := fields[k.Value]; !known {
				problem = pf.errorf("", nil, "unknown field %s (want name, path, algorithm, key, outage, capacity, refill_per_second, limit or window)", show(k.Value))
			}
		}
		if k != nil && k.Kind == yaml.ScalarNode && pf.nodes[k.Value] == nil {
			pf.nodes[k.Value] = v
		}
	}
	// Name the policy first, so every later error can say which it is.
	name, err := pf.str("name", true)
	if err != nil {
		return Policy{}, err
	}
	pf.name = name
	if problem != nil {
		if fe, ok := problem.(*FieldError); ok {
			fe.Policy = name
		}
		return Policy{}, problem
	}
	p, err := pf.build()
	if err != nil {
		return Policy{}, err
	}
	return p, pf.route(&p, ip)
}

// build checks the fields and builds the policy with its algorithm's
// constructor, found by name in core's registry.
func (pf *policyFields) build() (Policy, error) {
	if err := driver.CheckPolicyName(pf.name); err != nil {
		return Policy{}, pf.errorf("name", err, "%s", pf.cause(err))
	}
	p := Policy{Name: pf.name}
	name, err := pf.str("algorithm", true)
	if err != nil {
		return Policy{}, err
	}
	alg, err := driver.AlgorithmByName(name)
	shape := ""
	if err == nil {
		shape = shapeOf(alg)
	}
	if shape == "" {
		var known []string
		for _, n := range driver.AlgorithmNames() {
			if a, _ := driver.AlgorithmByName(n); shapeOf(a) != "" {
				known = append(known, n)
			}
		}
		return Policy{}, pf.errorf("algorithm", core.ErrInvalidPolicy, "unknown algorithm %s (want %s)", show(name), strings.Join(known, ", "))
	}
	for _, f := range []string{"capacity", "refill_per_second", "limit", "window"} {
		if pf.nodes[f] != nil && fields[f] != shape {
			return Policy{}, pf.errorf(f, core.ErrInvalidPolicy, "not a %s field (it belongs to %s)", name, namesOf(fields[f]))
		}
	}
	switch a := alg.(type) {
	case driver.RateAlgorithm:
		p.Policy, err = pf.rate(a)
	case driver.WindowAlgorithm:
		p.Policy, err = pf.window(a)
	}
	if err != nil {
		return Policy{}, err
	}
	return p, nil
}

// route reads the optional path, key and outage fields into p; ip is the
// client_ip block, for an ip key.
func (pf *policyFields) route(p *Policy, ip httplimit.IPOptions) error {
	var err error
	if p.Path, err = pf.optional("path"); err != nil {
		return err
	}
	if msg := checkPath(p.Path); p.Path != "" && msg != "" {
		return pf.errorf("path", nil, "%s", msg)
	}
	key, err := pf.optional("key")
	if err != nil {
		return err
	}
	if key != "" {
		if p.Key, err = ParseKeySource(key); err != nil {
			return pf.errorf("key", err, "%s", strings.TrimPrefix(err.Error(), "config: "))
		}
		if p.Key.kind == ipKey {
			p.Key.IP = ip
		}
	}
	outage, err := pf.str("outage", false)
	if err != nil {
		return err
	}
	if p.Outage, err = fallback.ParseOutageMode(outage); err != nil {
		return pf.errorf("outage", err, "unknown mode %s (want leases, fail_closed or fail_open)", show(outage))
	}
	return nil
}

// rate reads a rate-shaped policy: capacity and refill_per_second.
func (pf *policyFields) rate(alg driver.RateAlgorithm) (core.Policy, error) {
	capacity, err := pf.integer("capacity")
	if err != nil {
		return core.Policy{}, err
	}
	rate, err := pf.number("refill_per_second")
	if err != nil {
		return core.Policy{}, err
	}
	p, err := alg.RatePolicy(pf.name, capacity, rate)
	if err != nil {
		// The numbers are each positive; find which one is out of range.
		field := "capacity"
		if _, e := alg.RatePolicy(pf.name, 1, rate); e != nil {
			field = "refill_per_second"
		}
		return core.Policy{}, pf.errorf(field, err, "%s", pf.cause(err))
	}
	return p, nil
}

// window reads a window-shaped policy: limit and window.
func (pf *policyFields) window(alg driver.WindowAlgorithm) (core.Policy, error) {
	limit, err := pf.integer("limit")
	if err != nil {
		return core.Policy{}, err
	}
	window, err := pf.duration("window")
	if err != nil {
		return core.Policy{}, err
	}
	p, err := alg.WindowPolicy(pf.name, limit, window)
	if err != nil {
		field := "limit"
		if _, e := alg.WindowPolicy(pf.name, 1, window); e != nil {
			field = "window"
		}
		return core.Policy{}, pf.errorf(field, err, "%s", pf.cause(err))
	}
	return p, nil
}

// cause is err's message without the policy's name, which the FieldError
// already gives.
func (pf *policyFields) cause(err error) string {
	return strings.ReplaceAll(err.Error(), fmt.Sprintf("policy %q: ", pf.name), "")
}

// scalar returns field's node if the field is given and not null.
func (pf *policyFields) scalar(field string, required bool) (*yaml.Node, error) {
	n := pf.nodes[field]
	if n == nil || isNull(n) {
		if required {
			return nil, pf.errorf(field, nil, "required")
		}
		return nil, nil
	}
	if n.Kind != yaml.ScalarNode {
		return nil, pf.errorf(field, nil, "want a single value, got a list or mapping")
	}
	return n, nil
}

// optional reads a string field that may be left out, but not given empty.
func (pf *policyFields) optional(field string) (string, error) {
	v, err := pf.str(field, false)
	if err == nil && v == "" && pf.nodes[field] != nil && !isNull(pf.nodes[field]) {
		return "", pf.errorf(field, nil, "empty; leave the field out when the service supplies it")
	}
	return v, err
}

func (pf *policyFields) str(field string, required bool) (string, error) {
	n, err := pf.scalar(field, required)
	if n == nil {
		return "", err
	}
	if required && n.Value == "" {
		return "", pf.errorf(field, nil, "required, got an empty string")
	}
	return n.Value, nil
}

// integer reads a positive whole number. YAML would turn 20.5 into 20; the
// tag check refuses it instead.
func (pf *policyFields) integer(field string) (int64, error) {
	n, err := pf.scalar(field, true)
	if n == nil {
		return 0, err
	}
	var v int64
	if n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		return 0, pf.errorf(field, core.ErrInvalidPolicy, "must be a positive integer, got %s", show(n.Value))
	}
	if v <= 0 {
		return 0, pf.errorf(field, core.ErrInvalidPolicy, "must be a positive integer, got %d", v)
	}
	return v, nil
}

// number reads a positive, finite number.
func (pf *policyFields) number(field string) (float64, error) {
	n, err := pf.scalar(field, true)
	if n == nil {
		return 0, err
	}
	var v float64
	if tag := n.ShortTag(); tag != "!!int" && tag != "!!float" || n.Decode(&v) != nil {
		return 0, pf.errorf(field, core.ErrInvalidPolicy, "must be a positive number, got %s", show(n.Value))
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return 0, pf.errorf(field, core.ErrInvalidPolicy, "must be a positive number, got %s", strconv.FormatFloat(v, 'g', -1, 64))
	}
	return v, nil
}

// duration reads a positive Go duration such as "2s" or "1m30s".
func (pf *policyFields) duration(field string) (time.Duration, error) {
	n, err := pf.scalar(field, true)
	if n == nil {
		return 0, err
	}
	d, err := time.ParseDuration(n.Value)
	if n.ShortTag() != "!!str" || err != nil {
		return 0, pf.errorf(field, core.ErrInvalidPolicy, "must be a duration such as 2s or 500ms, got %s", show(n.Value))
	}
	if d <= 0 {
		return 0, pf.errorf(field, core.ErrInvalidPolicy, "must be positive, got %v", d)
	}
	return d, nil
}

// deref follows an alias to its anchored node (one level: aliases of
// aliases do not occur in parsed YAML).
func deref(n *yaml.Node) *yaml.Node {
	if n != nil && n.Kind == yaml.AliasNode {
		return n.Alias
	}
	return n
}
