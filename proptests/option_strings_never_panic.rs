//! Random option names and value strings, from code or from the environment, never panic:
//! each gives either a valid setting (readable back, within its spec) or a typed error.

use boundscope::frontend::{Environment, ProfiledSession};
use boundscope::options::{list, Audience, Options};
use boundscope::Error;
use proptest::prelude::*;

/// Option names: real ones, real ones with a typo, and noise.
fn names() -> impl Strategy<Value = String> {
    let real: Vec<String> = list().iter().map(|s| s.name.to_string()).collect();
    prop_oneof![
        prop::sample::select(real.clone()),
        (prop::sample::select(real), any::<prop::sample::Index>()).prop_map(|(n, i)| {
            let mut chars: Vec<char> = n.chars().collect();
            let at = i.index(chars.len());
            chars.remove(at);
            chars.into_iter().collect()
        }),
        "\\PC{0,24}",
    ]
}

/// Values: plausible ones and noise.
fn values() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "true",
            "false",
            "0",
            "1",
            "-1",
            "16",
            "4096",
            "99999999999999999999",
            "auto",
            "off",
            "ops",
            "regions",
            "consecutive",
            "dataflow",
            "",
            " 1",
            "1.5",
        ])
        .prop_map(str::to_string),
        "\\PC{0,16}",
        any::<i64>().prop_map(|i| i.to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Setting any name to any string, through the user or the developer entry point, is a
    /// valid setting or a typed error naming the problem.
    #[test]
    fn option_strings_give_a_setting_or_a_typed_error(name in names(), value in values(), developer in any::<bool>()) {
        let mut options = Options::new();
        let result = if developer { options.set_developer_str(&name, &value) } else { options.set_str(&name, &value) };
        match result {
            Ok(()) => {
                let spec = options.spec(&name).unwrap().clone();
                prop_assert!(developer || spec.audience == Audience::User);
                let got = options.get(&name).unwrap();
                prop_assert_eq!(spec.check(&got).unwrap(), got);
                prop_assert_eq!(options.set_names().collect::<Vec<_>>(), vec![spec.name]);
            }
            Err(e) => {
                let typed = matches!(e, Error::UnknownOption { .. } | Error::InvalidOptionValue { .. } | Error::DeveloperOption { .. });
                prop_assert!(typed, "{:?}", e);
                prop_assert!(!e.to_string().is_empty());
                prop_assert_eq!(options.set_names().count(), 0, "nothing half-set");
            }
        }
    }

    /// Any value of any of the front end's variables gives a session or an
    /// `InvalidEnvironment` error naming the variable.
    #[test]
    fn environment_values_give_a_session_or_a_typed_error(
        variable in prop::sample::select(vec!["BOUNDSCOPE_NVTX", "BOUNDSCOPE_FUSION", "BOUNDSCOPE_FUSION_STRATEGY", "BOUNDSCOPE_PROFILING", "NVTX_INJECTION64_PATH"]),
        value in values(),
    ) {
        match ProfiledSession::new(Options::new(), &Environment::from_pairs(&[(variable, &value)])) {
            Ok(session) => prop_assert!(["off", "regions", "ops"].contains(&session.profiling().level)),
            Err(Error::InvalidEnvironment { variable: v, .. }) => prop_assert_eq!(v, variable),
            Err(other) => prop_assert!(false, "unexpected error {:?}", other),
        }
    }
}
