import { Command, Help, Option } from 'commander';
import type { FlagSpec } from './args';

/** The heading of a command's own flags, and of the flags of the groups above it (and --help). */
export const FLAGS_HEADING = 'Flags:';
export const GLOBAL_FLAGS_HEADING = 'Global flags:';

/** A commander option made from a flag spec: its help shows the spec's placeholder (`--scope infer|admin`). */
export class FlagOption extends Option {
  constructor(readonly spec: FlagSpec) {
    super(
      `${spec.short === undefined ? '' : `-${spec.short}, `}--${spec.name}${spec.kind === 'switch' ? '' : ' <value>'}`,
      spec.kind === 'list' ? `${spec.description} (repeatable)` : spec.description,
    );
  }

  /** How the flag shows in the help: `-n, --name <n>`, long-only names indented to line up. */
  get term(): string {
    const { short, name, placeholder } = this.spec;
    return `${short === undefined ? '    ' : `-${short}, `}--${name}${placeholder === undefined ? '' : ` ${placeholder}`}`;
  }
}

/**
 * commander's help with infermesh's layout: subcommands by their name alone, flags with their
 * placeholders, no wrapping (details keep their own lines), and text after it (`afterHelp`).
 */
export class CliHelp extends Help {
  constructor(private readonly afterHelp: string | undefined) {
    super();
    this.helpWidth = Number.MAX_SAFE_INTEGER;
  }

  override subcommandTerm(cmd: Command): string {
    return cmd.name();
  }

  override optionTerm(option: Option): string {
    return option instanceof FlagOption ? option.term : super.optionTerm(option);
  }

  override formatHelp(cmd: Command, helper: Help): string {
    const text = super.formatHelp(cmd, helper);
    return this.afterHelp === undefined ? text : `${text}\n${this.afterHelp.trimEnd()}\n`;
  }
}

/** A commander command whose help is a CliHelp. */
export class CliCommand extends Command {
  afterHelp: string | undefined;

  override createHelp(): Help {
    return Object.assign(new CliHelp(this.afterHelp), this.configureHelp());
  }
}
