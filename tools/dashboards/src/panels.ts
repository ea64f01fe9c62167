import type * as cog from '@grafana/grafana-foundation-sdk/cog';
import * as common from '@grafana/grafana-foundation-sdk/common';
import * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import * as gauge from '@grafana/grafana-foundation-sdk/gauge';
import * as heatmap from '@grafana/grafana-foundation-sdk/heatmap';
import * as prometheus from '@grafana/grafana-foundation-sdk/prometheus';
import * as stat from '@grafana/grafana-foundation-sdk/stat';
import * as timeseries from '@grafana/grafana-foundation-sdk/timeseries';

/**
 * The uid of the Prometheus datasource that grafana/provisioning/datasources/prometheus.yaml
 * provisions. Every panel, query and variable names it, so the boards need no `${DS_PROMETHEUS}`
 * input when they are provisioned.
 */
export const DATASOURCE_UID = 'infermesh-prometheus';
export const DATASOURCE: dashboard.DataSourceRef = { type: 'prometheus', uid: DATASOURCE_UID };

/** Every board carries this tag; the boards link to each other through it. */
export const BOARD_TAG = 'infermesh';

/** One PromQL query of a panel. */
export interface Query {
  expr: string;
  /** Legend template, e.g. `{{model}}`; Grafana's automatic legend when absent. */
  legend?: string;
}

/** A threshold step: the first one's value is null (the base colour). */
export interface Step {
  value: number | null;
  color: string;
}

export interface PanelOptions {
  title: string;
  /** What the panel shows and how to read it: Grafana shows it in the panel's (i) tooltip. */
  description: string;
  /** A Grafana unit id: `s`, `bytes`, `reqps`, `percentunit`, `short`, `suffix:×`, … */
  unit: string;
  queries: Query[];
  /** Width in grid columns, out of 24 (default 12). */
  span?: number;
  /** Height in grid rows (default 8). */
  height?: number;
  min?: number;
  max?: number;
  decimals?: number;
  /** Absolute thresholds; the panel's colours follow them (stat, gauge) or draws them (time series). */
  thresholds?: Step[];
  mappings?: dashboard.ValueMapping[];
}

/** The settings the SDK's panel builders share. */
interface CommonPanelBuilder<B> extends cog.Builder<dashboard.Panel> {
  title(title: string): B;
  description(description: string): B;
  unit(unit: string): B;
  datasource(datasource: dashboard.DataSourceRef): B;
  span(w: number): B;
  height(h: number): B;
  min(min: number): B;
  max(max: number): B;
  decimals(decimals: number): B;
  thresholds(thresholds: cog.Builder<dashboard.ThresholdsConfig>): B;
  mappings(mappings: dashboard.ValueMapping[]): B;
  colorScheme(color: cog.Builder<dashboard.FieldColor>): B;
  withTarget(target: cog.Builder<cog.Dataquery>): B;
  id(id: number): B;
}

/** A panel builder of any kind, as a board takes it: it numbers the panels. */
export type AnyPanel = CommonPanelBuilder<unknown>;

function target(query: Query, index: number, kind: 'range' | 'instant' | 'heatmap'): prometheus.DataqueryBuilder {
  const builder = new prometheus.DataqueryBuilder()
    .datasource(DATASOURCE)
    .refId(String.fromCharCode('A'.charCodeAt(0) + index))
    .expr(query.expr)
    .legendFormat(query.legend ?? '__auto');
  if (kind === 'instant') builder.instant();
  else builder.range();
  if (kind === 'heatmap') builder.format(prometheus.PromQueryFormat.Heatmap);
  return builder;
}

function thresholds(steps: Step[]): dashboard.ThresholdsConfigBuilder {
  return new dashboard.ThresholdsConfigBuilder().mode(dashboard.ThresholdsMode.Absolute).steps(steps);
}

function applyCommon<B extends CommonPanelBuilder<B>>(
  builder: B,
  options: PanelOptions,
  kind: 'range' | 'instant' | 'heatmap',
): B {
  if (options.queries.length === 0) throw new Error(`panel "${options.title}" has no query`);
  if (options.queries.length > 26) throw new Error(`panel "${options.title}" has more queries than refIds A to Z`);
  builder
    .title(options.title)
    .description(options.description)
    .unit(options.unit)
    .datasource(DATASOURCE)
    .span(options.span ?? 12)
    .height(options.height ?? 8);
  if (options.min !== undefined) builder.min(options.min);
  if (options.max !== undefined) builder.max(options.max);
  if (options.decimals !== undefined) builder.decimals(options.decimals);
  if (options.thresholds !== undefined) builder.thresholds(thresholds(options.thresholds));
  if (options.mappings !== undefined) builder.mappings(options.mappings);
  options.queries.forEach((query, index) => builder.withTarget(target(query, index, kind)));
  return builder;
}

/** A time series of range queries. */
export function timeSeries(
  options: PanelOptions & { stack?: boolean; legendTable?: boolean },
): timeseries.PanelBuilder {
  const builder = applyCommon(new timeseries.PanelBuilder(), options, 'range')
    .lineWidth(1)
    .fillOpacity(options.stack === true ? 40 : 10)
    .showPoints(common.VisibilityMode.Never)
    .tooltip(
      new common.VizTooltipOptionsBuilder().mode(common.TooltipDisplayMode.Multi).sort(common.SortOrder.Descending),
    )
    .legend(
      options.legendTable === true
        ? new common.VizLegendOptionsBuilder()
            .showLegend(true)
            .displayMode(common.LegendDisplayMode.Table)
            .placement(common.LegendPlacement.Right)
            .calcs(['mean', 'max', 'lastNotNull'])
        : new common.VizLegendOptionsBuilder()
            .showLegend(true)
            .displayMode(common.LegendDisplayMode.List)
            .placement(common.LegendPlacement.Bottom),
    );
  if (options.stack === true) builder.stacking(new common.StackingConfigBuilder().mode(common.StackingMode.Normal));
  if (options.thresholds !== undefined)
    builder.thresholdsStyle(
      new common.GraphThresholdsStyleConfigBuilder().mode(common.GraphThresholdsStyleMode.Dashed),
    );
  return builder;
}

/**
 * A stat of instant queries (one value per series, the latest): cheap even over 30-day windows. Its
 * colour follows the thresholds when there are some.
 */
export function statPanel(options: PanelOptions): stat.PanelBuilder {
  const builder = applyCommon(new stat.PanelBuilder(), options, 'instant')
    .reduceOptions(new common.ReduceDataOptionsBuilder().calcs(['lastNotNull']).values(false))
    .graphMode(common.BigValueGraphMode.None)
    .colorMode(options.thresholds === undefined ? common.BigValueColorMode.None : common.BigValueColorMode.Value)
    .textMode(common.BigValueTextMode.ValueAndName)
    .orientation(common.VizOrientation.Auto);
  if (options.thresholds !== undefined)
    builder.colorScheme(new dashboard.FieldColorBuilder().mode(dashboard.FieldColorModeId.Thresholds));
  return builder;
}

/** A gauge of instant queries, coloured by its thresholds. */
export function gaugePanel(options: PanelOptions): gauge.PanelBuilder {
  return applyCommon(new gauge.PanelBuilder(), options, 'instant')
    .reduceOptions(new common.ReduceDataOptionsBuilder().calcs(['lastNotNull']).values(false))
    .showThresholdMarkers(true)
    .showThresholdLabels(false)
    .colorScheme(new dashboard.FieldColorBuilder().mode(dashboard.FieldColorModeId.Thresholds));
}

/**
 * A heatmap of a Prometheus histogram: the query returns per-bucket counts (`sum by (le) (increase(…_bucket[…]))`)
 * in Grafana's heatmap format, and Grafana draws the buckets as they are (no recalculation). `unit` is
 * the unit of the buckets' bounds (the y axis); a cell's value is a count of observations.
 */
export function heatmapPanel(options: Omit<PanelOptions, 'queries'> & { query: Query }): heatmap.PanelBuilder {
  const { query, unit, ...rest } = options;
  return applyCommon(
    new heatmap.PanelBuilder(),
    { ...rest, unit: 'short', queries: [{ legend: '{{le}}', ...query }] },
    'heatmap',
  )
    .calculate(false)
    .yAxis(new heatmap.YAxisConfigBuilder().unit(unit))
    .cellValues(new heatmap.CellValuesBuilder().unit('short'))
    .color(
      new heatmap.HeatmapColorOptionsBuilder()
        .mode(heatmap.HeatmapColorMode.Scheme)
        .scheme('Oranges')
        .fill('dark-orange')
        .scale(heatmap.HeatmapColorScale.Exponential)
        .exponent(0.5)
        .steps(64),
    )
    .showValue(common.VisibilityMode.Never)
    .mode(common.TooltipDisplayMode.Single)
    .showYHistogram();
}

/** Value mappings of a gauge that holds a small enumeration, e.g. a circuit breaker's state. */
export function valueText(texts: Record<number, { text: string; color: string }>): dashboard.ValueMapping[] {
  const options: Record<string, dashboard.ValueMappingResult> = {};
  Object.entries(texts).forEach(([value, { text, color }], index) => (options[value] = { text, color, index }));
  return [{ type: dashboard.MappingType.ValueToText, options }];
}

/** A query variable over a label of one metric: several values or all of them (the regex `.*`). */
export function labelVariable(
  name: string,
  label: string,
  description: string,
  query: string,
): dashboard.QueryVariableBuilder {
  return new dashboard.QueryVariableBuilder(name)
    .label(label)
    .description(description)
    .datasource(DATASOURCE)
    .query(query)
    .refresh(dashboard.VariableRefresh.OnTimeRangeChanged)
    .sort(dashboard.VariableSort.NaturalAsc)
    .multi(true)
    .includeAll(true)
    .allValue('.*')
    .current({ selected: true, text: ['All'], value: ['$__all'] });
}

/** A variable whose values the board offers (the first listed after `initial` is not special). */
export function choiceVariable(
  name: string,
  label: string,
  description: string,
  values: string[],
  initial: string,
): dashboard.CustomVariableBuilder {
  if (!values.includes(initial))
    throw new Error(`variable ${name}: the initial value ${initial} is not one of ${values.join(', ')}`);
  return new dashboard.CustomVariableBuilder(name)
    .label(label)
    .description(description)
    .values(values.join(','))
    .current({ selected: true, text: initial, value: initial })
    .options(values.map((value) => ({ selected: value === initial, text: value, value })))
    .multi(false)
    .includeAll(false);
}

export interface RowSpec {
  title: string;
  panels: AnyPanel[];
}

export interface BoardSpec {
  uid: string;
  title: string;
  description: string;
  tags: string[];
  variables: cog.Builder<dashboard.VariableModel>[];
  rows: RowSpec[];
}

/**
 * Builds a board: its rows open (each row's panels follow it on the grid, which is how Grafana
 * stores an expanded row), its panels numbered in order, a link to the other infermesh boards.
 */
export function buildBoard(spec: BoardSpec): dashboard.Dashboard {
  const builder = new dashboard.DashboardBuilder(spec.title)
    .uid(spec.uid)
    .description(spec.description)
    .tags([BOARD_TAG, ...spec.tags])
    .editable()
    .timezone('browser')
    .time({ from: 'now-6h', to: 'now' })
    .refresh('30s')
    .tooltip(dashboard.DashboardCursorSync.Crosshair)
    .link(
      new dashboard.DashboardLinkBuilder('infermesh boards')
        .type(dashboard.DashboardLinkType.Dashboards)
        .tags([BOARD_TAG])
        .asDropdown(true)
        .includeVars(false)
        .keepTime(true)
        .targetBlank(false)
        .icon('external link')
        .tooltip('The other infermesh boards'),
    );
  for (const variable of spec.variables) builder.withVariable(variable);
  let id = 0;
  for (const row of spec.rows) {
    builder.withRow(new dashboard.RowBuilder(row.title).id(++id));
    for (const panel of row.panels) {
      panel.id(++id);
      builder.withPanel(panel);
    }
  }
  return builder.build();
}
