package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// chaosCheck is one entry of the chaos harness's catalog.
type chaosCheck struct {
	Name       string
	Invariants []int
}

// chaosReport is the part of a campaign's report.json read here.
type chaosReport struct {
	Control    string   `json:"control"`
	Checks     []string `json:"checks"`
	Violations []string `json:"violations"`
}

// maxReports bounds how many campaign reports are read (invariant 13).
const maxReports = 1000

// chaosVerdicts reads the catalog and the reports: for each check, "pass"
// when honest campaigns ran it and none found anything, "FAIL" when one did,
// "not run" when no report names it. Negative-control campaigns are left
// out: they are meant to fail.
func chaosVerdicts(catalogPath, reportsGlob string) ([]chaosCheck, map[string]string, int, error) {
	if catalogPath == "" {
		return nil, nil, 0, nil
	}
	data, err := os.ReadFile(catalogPath)
	if err != nil {
		return nil, nil, 0, err
	}
	var catalog []chaosCheck
	if err := json.Unmarshal(data, &catalog); err != nil {
		return nil, nil, 0, fmt.Errorf("%s: %w", catalogPath, err)
	}
	verdict := map[string]string{}
	for _, c := range catalog {
		verdict[c.Name] = "not run"
	}
	files, _ := filepath.Glob(reportsGlob)
	if len(files) > maxReports {
		files = files[len(files)-maxReports:]
	}
	honest := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, 0, err
		}
		var r chaosReport
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, nil, 0, fmt.Errorf("%s: %w", f, err)
		}
		if r.Control != "" {
			continue
		}
		honest++
		for _, name := range r.Checks {
			if verdict[name] == "not run" {
				verdict[name] = "pass"
			}
		}
		for _, name := range r.Violations {
			verdict[name] = "FAIL"
		}
	}
	return catalog, verdict, honest, nil
}
