"""The self-contained HTML report (``tokentrace report``): plots of the analyzer's SQL outputs."""

from analyzer.report.build import ReportInputs, build_report, choose_request, load_audit_findings

__all__ = ["ReportInputs", "build_report", "choose_request", "load_audit_findings"]
