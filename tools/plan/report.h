// strata-plan's reports over a Plan (estimate.h) and the options it was made
// with (cli.h): the tables, the JSON document, and the verdict.
//
// Contract: pure functions of their arguments; thread-safe. Sizes are
// binary (GiB), traffic and rates decimal (GB); ZeRO figures are rounded to
// one decimal of a GB the same way in the table and in the JSON.
#ifndef STRATA_TOOLS_PLAN_REPORT_H_
#define STRATA_TOOLS_PLAN_REPORT_H_

#include <nlohmann/json.hpp>
#include <string>

#include "tools/plan/cli.h"
#include "tools/plan/estimate.h"

namespace strata::plan {

// "fits", or the shortfall with the budget flags and the model size that
// would fix it.
std::string Verdict(const Plan& plan);

// The placement, traffic, floor and capacity tables.
std::string TextReport(const Plan& plan, const PlanOptions& options);
// The same figures as one JSON document.
nlohmann::ordered_json JsonReport(const Plan& plan, const PlanOptions& options);

// What strata-plan prints on stdout: the tables, or with options.json the
// JSON document; with options.explain the engine's schedule too.
std::string Report(const Plan& plan, const PlanOptions& options);

}  // namespace strata::plan

#endif  // STRATA_TOOLS_PLAN_REPORT_H_
