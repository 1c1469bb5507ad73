//! The diagnostics' codes: one enum, each code's stable name (as reports,
//! the JSON output and editors show it) and its explanation, which
//! `linnetc explain CODE` prints, as `rustc --explain` does. The
//! language reference's list of codes is checked against [`Code::ALL`].

use std::fmt;

macro_rules! codes {
    ($($variant:ident = $name:literal: $explanation:literal,)*) => {
        /// What a diagnostic is about.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Code {
            $($variant,)*
        }

        impl Code {
            /// Every code, in the order the reference lists them.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The stable name: `shape-mismatch`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Code::$variant => $name,)*
                }
            }

            /// What the code means, why it is an error, and what to do.
            pub fn explanation(self) -> &'static str {
                match self {
                    $(Code::$variant => $explanation,)*
                }
            }
        }
    };
}

codes! {
    SyntaxError = "syntax-error":
        "The source does not parse: a token where the grammar wants another, a bracket never closed, or \
         text the lexer does not know. The report points at the first token that does not fit and says \
         what was expected there.",
    PackageError = "package-error":
        "The package's files do not make a package: `linnet.toml` or `nest.toml` is missing, is not \
         TOML, lacks a required field, or two dependencies share a name. The report names the file and \
         the field.",
    UnknownModule = "unknown-module":
        "A `use` names a module that neither the package (`crate.…`), nor a dependency, nor the \
         standard library (`std.…`) has. The report says which file it looked for.",
    ModuleNameMismatch = "module-name-mismatch":
        "A file's `module` header names another module than the one the file is (the name `use` reaches \
         it by, from its place in the package). Fix the header to the name the report expects.",
    UnknownImport = "unknown-import":
        "A `use a::{X}` names an item that module `a` does not declare. The report lists the closest \
         names it does declare.",
    PrivateItem = "private-item":
        "An item or a block's function is used from outside where it is declared, but it is not `pub`. \
         Declare it `pub` (`pub fn`, `pub type`) to use it there.",
    DuplicateDefinition = "duplicate-definition":
        "Two declarations in one scope share a name: two functions or blocks in a module, two generics \
         of one item, two parameters of one function. Rename one.",
    UnknownName = "unknown-name":
        "A name is not in scope: no `let`, parameter, generic, sub, param or state of that name is \
         visible here. The report suggests the closest name in scope.",
    UnknownFunction = "unknown-function":
        "A call names a function that is neither a built-in, nor declared in this module, nor imported. \
         Import it with `use`, or check its spelling against the suggestion.",
    UnknownMethod = "unknown-method":
        "A call `x.f(...)` names a function that the block (or the trait bound of a generic block) does \
         not have. A generic block's functions are only those its trait declares.",
    NotABlock = "not-a-block":
        "A method is called on something that is not a block: a tensor, a dim, or an array of subs. An \
         array of subs is run over with `static for layer in layers { layer.f(...) }`.",
    NotAValue = "not-a-value":
        "A function or a block is used where a value is expected. Call the function, or use one of the \
         block's params.",
    KindMismatch = "kind-mismatch":
        "A generic is used as the wrong kind of thing: a dim where a dtype is expected, a dtype as a \
         value, a block generic as a dim. Generics are declared with their kind (`N: Dim`, `T: Float`).",
    GenericCount = "generic-count":
        "An item is given more or fewer generic arguments than it declares. Give all of them, or none \
         and let them be inferred from the arguments.",
    TypeError = "type-error":
        "An expression has no type the language allows where it stands: a string outside a message \
         argument, arithmetic on a boolean, a scalar where a tensor is needed.",
    TypeMismatch = "type-mismatch":
        "A value's type is not the one required: a condition that is not a `bool` scalar, an argument or \
         a returned value of another type than declared. The report shows both types.",
    ShapeMismatch = "shape-mismatch":
        "Two shapes that must agree do not, under the item's `where` clauses: an argument's shape and \
         its parameter's, operands that do not broadcast, a returned tensor and the declared result. \
         Shapes are compared symbolically: `Heads` and `KvHeads` are different dims unless a `where` \
         clause makes them equal. The report shows both shapes and points at the value.",
    DtypeMismatch = "dtype-mismatch":
        "Operands or arguments have different element types where one is required (`f32` and `bf16` in \
         one `+`). Convert one with `cast<T>(x)`.",
    ReshapeSize = "reshape-size":
        "A `reshape` to a shape whose number of elements cannot be shown equal to the input's, under the \
         `where` clauses. Add the clause that makes them equal, or fix the target shape.",
    BadPermutation = "bad-permutation":
        "`permute` takes a list of the input's axis numbers, each once: `[0, 2, 1, 3]` for a rank-4 \
         tensor.",
    BadAxis = "bad-axis":
        "An axis argument names no axis of the tensor, or an axis whose size is not fixed where a fixed \
         one is needed (the axis of a `concat`).",
    RankMismatch = "rank-mismatch":
        "A tensor is indexed with a different number of indices than it has axes, or given where a \
         tensor of another rank is required. Index every axis once.",
    SliceOutOfBounds = "slice-out-of-bounds":
        "The checker cannot show that a slice `lo:hi` lies within its axis under the `where` clauses. \
         Add the clause that bounds it (`where Rot <= HeadDim`).",
    IndexOutOfBounds = "index-out-of-bounds":
        "The checker cannot show that a fixed position lies within its axis under the `where` clauses.",
    DynamicSlice = "dynamic-slice":
        "A slice's bounds must be dims known before running. A position known only at run time is read \
         with a gather in an index definition.",
    DynamicShape = "dynamic-shape":
        "A shape is made of dims known before running (generics and integer literals), not of run-time \
         values.",
    IndexDtype = "index-dtype":
        "A computed index (a gather's position, read from a tensor) must be an `i64` scalar. Convert \
         it with `cast<i64>(x)`.",
    UnboundIndex = "unbound-index":
        "An index variable of an index definition indexes no axis directly, so its range is unknown. \
         Use it as a plain index of some operand's axis.",
    IndexRangeMismatch = "index-range-mismatch":
        "One index variable indexes two axes of different sizes. Both places are shown; make the sizes \
         agree or use two indices.",
    IndexBodyNotScalar = "index-body-not-scalar":
        "An index definition's body computes one element: it must be a scalar expression of indexed \
         elements, not a tensor.",
    VariadicIndex = "variadic-index":
        "A variadic index `*s` stands for several indices at once and cannot be used where one index is \
         needed.",
    MisplacedList = "misplaced-list":
        "A bracketed list is only an argument of `reshape`, `permute` or `fill`.",
    PatternMismatch = "pattern-mismatch":
        "A `let (a, b) = ...` pattern has a different number of names than the value has parts.",
    AssignToImmutable = "assign-to-immutable":
        "Only a `state` of the block can be assigned (`cache = ...`); parameters, params and `let` names \
         cannot.",
    NotASubArray = "not-a-sub-array":
        "`static for` runs over an array of subs (`layers: [Layer; N]`), and this is something else.",
    MissingArgument = "missing-argument":
        "A call gives fewer arguments than the function declares parameters. The report names the \
         missing ones.",
    ExtraArgument = "extra-argument":
        "A call gives more arguments than the function declares parameters.",
    NamedArgument = "named-argument":
        "Only built-ins take named arguments (`softmax(x, axis = 1)`); a Linnet function takes its \
         arguments by position.",
    CannotInfer = "cannot-infer":
        "A generic of the callee is not fixed by its arguments' types. Give it explicitly: \
         `f<B, S>(x)`.",
    UnsatisfiedWhere = "unsatisfied-where":
        "A call's generic arguments do not satisfy the callee's `where` clauses, as far as the caller's \
         own clauses show. The clause broken is shown beside the call; add it to the caller's `where`, \
         or pass arguments that meet it.",
    MissingReturn = "missing-return":
        "A function declared to return a value does not end with `return`.",
    MissingBody = "missing-body":
        "A function has no body. Only an `intrinsic fn`, which the compiler provides, is declared \
         without one.",
    IntrinsicBody = "intrinsic-body":
        "An `intrinsic fn` has no body: the compiler provides it. Remove the body, or drop `intrinsic` \
         to write it in Linnet.",
    MisplacedEntry = "misplaced-entry":
        "An `entry` belongs to a block (the model's root): it is what the runtime calls.",
    MisplacedIntrinsic = "misplaced-intrinsic":
        "An `intrinsic fn` is a free function of a module, not a block's function.",
    EntryGeneric = "entry-generic":
        "An entry's generics are dims, bound from the shapes of its inputs when the runtime calls it.",
    EntryCall = "entry-call":
        "An entry is called by the runtime, not by Linnet code. Call an ordinary function that the \
         entry calls too.",
    DimOverflow = "dim-overflow":
        "A dim's value is larger than the compiler can count in 64 bits.",
    NestingTooDeep = "nesting-too-deep":
        "An expression nests more than 256 levels deep (brackets, operators, method chains). Split it \
         into named parts with `let`.",
    NotATrait = "not-a-trait":
        "A generic's bound names something that is not a trait.",
    UnmetBound = "unmet-bound":
        "A block given for a generic does not meet the generic's trait bound: it lacks a function the \
         trait declares, or declares it with another signature.",
    UnusedLet = "unused-let":
        "A name bound by `let`, `var` or `static for` is never read (a warning). Its value is computed \
         for nothing, which is often a mistake: a cache written to a `let` and not assigned back to \
         its `state`, a result the next line meant to use. Use it, drop it, or start its name with \
         `_` where that is meant.",
    UnusedImport = "unused-import":
        "A name a module's `use` brings in is never referred to in that module (a warning). Remove \
         it (the fix offered does), or use it.",
    UnknownRoot = "unknown-root":
        "The model card (`nest.toml`) names no root block, or one that the source does not declare: \
         `[source] root = \"Model\"`.",
    UnknownEntry = "unknown-entry":
        "The model card names an entry that the root block does not have.",
    UnknownGeneric = "unknown-generic":
        "The model card gives a value for a generic that the root block does not declare.",
    MissingGeneric = "missing-generic":
        "The root block has a generic that the model card does not give, or one (a block generic) that \
         a card cannot give.",
    BadGenericValue = "bad-generic-value":
        "A model card's value does not fit its generic's kind: a dim takes a whole number, a dtype \
         generic the name of an element type (`T = \"bf16\"`).",
    ModelTooLarge = "model-too-large":
        "The model card asks for more than a machine can hold: over 1 PiB of parameters or of states, \
         or over 2^20 parameter tensors. The report names the generic that makes it so.",
    UnknownCheckDim = "unknown-check-dim":
        "The model card's `[check]` gives a dim that no entry of the root block declares (a warning: \
         the value is not used).",
    NoWeights = "no-weights":
        "The model card has no `[weights] bindings` (nor a `gguf` naming), so no checkpoint can be \
         loaded for it: `linnet run` would report every parameter as unbound. A warning, since a card \
         may be meant for checking alone. Add `[weights]` with `bindings = \"bindings.json\"`, the \
         file mapping each parameter path to the checkpoint's tensor name.",
    MissingBinding = "missing-binding":
        "A parameter of the model has no checkpoint tensor in `bindings.json`, so loading weights would \
         fail. Add its binding.",
    UnknownBinding = "unknown-binding":
        "`bindings.json` binds a path that is not a parameter of this model (a warning: the binding is \
         not used). The report suggests the closest parameter path.",
    GgufNames = "gguf-names":
        "`gguf.json` (how a llama.cpp GGUF file's tensors map to the model's parameters) is malformed: \
         not JSON, a pattern that does not parse, or a change the loader does not know.",
    MissingGgufName = "missing-gguf-name":
        "A parameter of the model has no GGUF source in `gguf.json`, so a llama.cpp file could not be \
         loaded. Add its tensor name.",
    CheckpointConfig = "checkpoint-config":
        "The checkpoint's `config.json` contradicts the model card: a `[config]` line requires a value \
         the file does not have (`tie_word_embeddings = false` where it says true), a derived size that \
         does not hold, or a generic the file gives as something it cannot be (a fraction for a size). \
         The report shows the card's line and the file's value. Run the checkpoint with a package \
         written for it, or fix the card.",
    Unsupported = "unsupported":
        "The package checks, but lowering it to the tensor IR meets a construct the IR cannot express \
         yet. The report names the construct; rewrite it with what the language's reference lists as \
         lowered, or report it as a missing feature.",
    InvalidIr = "invalid-ir":
        "The compiler's own check of the IR it made from the package failed, after lowering or after \
         one of its passes (the report names which). This is a bug in Linnet, not in the package: \
         please report it with the package. `LINNET_VERIFY_IR=1` checks after every pass in a release \
         build too, so that the pass at fault is named.",
}

impl Code {
    /// The code named `name`, if there is one.
    pub fn parse(name: &str) -> Option<Code> {
        Code::ALL.iter().copied().find(|code| code.name() == name)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Codes compare with their names, as tests and tools spell them.
impl PartialEq<&str> for Code {
    fn eq(&self, name: &&str) -> bool {
        self.name() == *name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_one_code_and_reads_back() {
        let mut names: Vec<&str> = Code::ALL.iter().map(|code| code.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Code::ALL.len(), "two codes share a name");
        for &code in Code::ALL {
            assert_eq!(Code::parse(code.name()), Some(code));
            assert!(code.explanation().len() > 40, "{code} explains too little");
        }
        assert_eq!(Code::parse("no-such-code"), None);
    }

    /// The language reference lists exactly the codes there are.
    #[test]
    fn the_reference_lists_every_code() {
        let reference = include_str!("../../../docs/language.md");
        let section = reference.split("## Diagnostics").nth(1).expect("a Diagnostics section");
        let section = section.split("\n## ").next().unwrap();
        let looks_like_a_code = |name: &&str| {
            Code::parse(name).is_some()
                || name.contains('-') && name.chars().all(|c| c.is_ascii_lowercase() || c == '-')
        };
        let mut listed: Vec<&str> = section.split('`').skip(1).step_by(2).filter(looks_like_a_code).collect();
        for name in &listed {
            assert!(Code::parse(name).is_some(), "docs/language.md lists `{name}`, which is no code");
        }
        for &code in Code::ALL {
            assert!(listed.contains(&code.name()), "docs/language.md does not list `{code}`");
        }
        let count = listed.len();
        listed.sort_unstable();
        listed.dedup();
        assert_eq!(listed.len(), count, "docs/language.md lists a code twice");
    }
}
