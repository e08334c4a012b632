//! The household's fixed vocabulary: rooms, receptacle kinds, object kinds and task kinds.
//!
//! Everything the generator may place, and every word the observations use for things, comes
//! from these tables. Object kinds carry their plausible places with weights (apples lie on
//! countertops, in fridges and on dining tables), so search is needed but common sense helps.
//! Changing a table changes every generated task: treat it like a data-set version.

/// The kind of room a task takes place in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    Kitchen,
    Bedroom,
    Living,
}

impl Room {
    /// Every room kind.
    pub const ALL: [Room; 3] = [Room::Kitchen, Room::Bedroom, Room::Living];

    /// The room named `name` (the word [`Room::name`] gives), if any.
    pub fn from_name(name: &str) -> Option<Room> {
        Room::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The word the observations use.
    pub fn name(self) -> &'static str {
        match self {
            Room::Kitchen => "kitchen",
            Room::Bedroom => "bedroom",
            Room::Living => "livingroom",
        }
    }

    /// Receptacle kinds this room may hold, with the most instances of each.
    pub(crate) fn pool(self) -> &'static [(RecKind, u32)] {
        use RecKind::*;
        match self {
            Room::Kitchen => &[
                (Cabinet, 6),
                (Countertop, 3),
                (Diningtable, 1),
                (Drawer, 4),
                (Fridge, 1),
                (Garbagecan, 1),
                (Microwave, 1),
                (Shelf, 2),
                (Sinkbasin, 1),
                (Stoveburner, 2),
            ],
            Room::Bedroom => &[
                (Armchair, 1),
                (Bed, 1),
                (Desk, 2),
                (Drawer, 5),
                (Dresser, 1),
                (Garbagecan, 1),
                (Shelf, 4),
                (Sidetable, 2),
            ],
            Room::Living => &[
                (Armchair, 1),
                (Cabinet, 4),
                (Coffeetable, 1),
                (Drawer, 4),
                (Garbagecan, 1),
                (Shelf, 3),
                (Sidetable, 2),
                (Sofa, 1),
                (Tvstand, 1),
            ],
        }
    }

    /// Receptacles every room of this kind has, whatever the size knob says.
    pub(crate) fn fixtures(self) -> &'static [RecKind] {
        use RecKind::*;
        match self {
            Room::Kitchen => &[Countertop, Fridge, Microwave, Sinkbasin],
            Room::Bedroom => &[Bed],
            Room::Living => &[Sofa],
        }
    }

    /// Receptacle kinds a desk lamp can stand on.
    pub(crate) fn lamp_hosts(self) -> &'static [RecKind] {
        match self {
            Room::Kitchen => &[],
            Room::Bedroom => &[RecKind::Desk, RecKind::Sidetable],
            Room::Living => &[RecKind::Sidetable],
        }
    }

    pub(crate) fn has(self, kind: RecKind) -> bool {
        self.pool().iter().any(|&(k, _)| k == kind)
    }

    /// The most instances of `kind` this room may hold (0: none).
    pub(crate) fn most(self, kind: RecKind) -> u32 {
        self.pool()
            .iter()
            .find(|&&(k, _)| k == kind)
            .map_or(0, |&(_, n)| n)
    }
}

/// A kind of receptacle. The declaration order (alphabetical) is the canonical order of a
/// room's receptacles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RecKind {
    Armchair,
    Bed,
    Cabinet,
    Coffeetable,
    Countertop,
    Desk,
    Diningtable,
    Drawer,
    Dresser,
    Fridge,
    Garbagecan,
    Microwave,
    Shelf,
    Sidetable,
    Sinkbasin,
    Sofa,
    Stoveburner,
    Tvstand,
}

impl RecKind {
    pub fn name(self) -> &'static str {
        use RecKind::*;
        match self {
            Armchair => "armchair",
            Bed => "bed",
            Cabinet => "cabinet",
            Coffeetable => "coffeetable",
            Countertop => "countertop",
            Desk => "desk",
            Diningtable => "diningtable",
            Drawer => "drawer",
            Dresser => "dresser",
            Fridge => "fridge",
            Garbagecan => "garbagecan",
            Microwave => "microwave",
            Shelf => "shelf",
            Sidetable => "sidetable",
            Sinkbasin => "sinkbasin",
            Sofa => "sofa",
            Stoveburner => "stoveburner",
            Tvstand => "tvstand",
        }
    }

    /// Containers must be opened before their contents can be seen, taken or added to.
    pub fn openable(self) -> bool {
        use RecKind::*;
        matches!(self, Cabinet | Drawer | Fridge | Microwave)
    }

    /// `"in"` for containers and basins, `"on"` for surfaces.
    pub fn preposition(self) -> &'static str {
        use RecKind::*;
        match self {
            Cabinet | Drawer | Fridge | Microwave | Sinkbasin | Garbagecan => "in",
            _ => "on",
        }
    }
}

/// What a task may ask of an object kind.
pub(crate) mod can {
    pub const CLEAN: u8 = 1;
    pub const HEAT: u8 = 2;
    pub const COOL: u8 = 4;
    /// Small enough to examine under a desk lamp.
    pub const LIGHT: u8 = 8;
}

/// A kind of portable object.
#[derive(Debug)]
pub(crate) struct ObjectKind {
    pub name: &'static str,
    pub plural: &'static str,
    /// The rooms it belongs to.
    pub rooms: &'static [Room],
    /// Where it is plausibly found, with relative weights. Only kinds present in a room count.
    pub places: &'static [(RecKind, u32)],
    /// Bit set of [`can`] flags.
    pub can: u8,
}

impl ObjectKind {
    pub fn weight_in(&self, kind: RecKind) -> u32 {
        self.places
            .iter()
            .find(|&&(k, _)| k == kind)
            .map_or(0, |&(_, w)| w)
    }
}

macro_rules! objects {
    ($($name:literal / $plural:literal in $rooms:ident : [$($rec:ident $w:literal),*] $can:expr;)*) => {
        &[$(ObjectKind {
            name: $name,
            plural: $plural,
            rooms: $rooms,
            places: &[$((RecKind::$rec, $w)),*],
            can: $can,
        }),*]
    };
}

use can::{CLEAN as C, COOL as K, HEAT as H, LIGHT as L};

const KITCHEN: &[Room] = &[Room::Kitchen];
const BED: &[Room] = &[Room::Bedroom];
const LIVING: &[Room] = &[Room::Living];
const BED_LIVING: &[Room] = &[Room::Bedroom, Room::Living];

/// Every object kind, with its rooms and plausible places.
pub(crate) static OBJECTS: &[ObjectKind] = objects! {
    "apple" / "apples" in KITCHEN: [Countertop 3, Fridge 3, Diningtable 2, Garbagecan 1] C | H | K;
    "tomato" / "tomatoes" in KITCHEN: [Countertop 3, Fridge 3, Diningtable 2] C | H | K;
    "potato" / "potatoes" in KITCHEN: [Countertop 3, Fridge 2, Diningtable 2, Cabinet 1] C | H | K;
    "egg" / "eggs" in KITCHEN: [Fridge 3, Countertop 2, Diningtable 1] C | H | K;
    "bread" / "breads" in KITCHEN: [Countertop 3, Diningtable 2, Fridge 1] H | K;
    "lettuce" / "lettuces" in KITCHEN: [Fridge 3, Countertop 2, Diningtable 1] C | K;
    "mug" / "mugs" in KITCHEN: [Cabinet 3, Countertop 2, Diningtable 2, Sinkbasin 1, Stoveburner 1] C | H | K;
    "cup" / "cups" in KITCHEN: [Cabinet 3, Countertop 2, Diningtable 1, Sinkbasin 1] C | H | K;
    "plate" / "plates" in KITCHEN: [Cabinet 3, Countertop 2, Diningtable 2, Sinkbasin 1] C | H | K;
    "bowl" / "bowls" in KITCHEN: [Cabinet 3, Countertop 2, Diningtable 1, Fridge 1] C | K;
    "pan" / "pans" in KITCHEN: [Stoveburner 3, Cabinet 2, Countertop 1, Sinkbasin 1] C | K;
    "pot" / "pots" in KITCHEN: [Stoveburner 3, Cabinet 2, Countertop 1] C | K;
    "fork" / "forks" in KITCHEN: [Drawer 3, Countertop 2, Diningtable 2, Sinkbasin 1] C;
    "spoon" / "spoons" in KITCHEN: [Drawer 3, Countertop 2, Diningtable 2, Sinkbasin 1] C;
    "knife" / "knives" in KITCHEN: [Drawer 3, Countertop 2, Diningtable 1] C;
    "spatula" / "spatulas" in KITCHEN: [Drawer 3, Countertop 2, Stoveburner 1] C;
    "bottle" / "bottles" in KITCHEN: [Fridge 2, Cabinet 2, Countertop 2, Garbagecan 1] K;
    "saltshaker" / "saltshakers" in KITCHEN: [Countertop 2, Cabinet 2, Shelf 2, Diningtable 1] 0;
    "book" / "books" in BED_LIVING: [Shelf 3, Desk 2, Bed 2, Sidetable 2, Coffeetable 2, Sofa 1, Drawer 1] L;
    "pen" / "pens" in BED: [Desk 3, Drawer 3, Sidetable 2, Shelf 1, Dresser 1] L;
    "pencil" / "pencils" in BED: [Desk 3, Drawer 3, Sidetable 2, Shelf 1] L;
    "cellphone" / "cellphones" in BED_LIVING: [Bed 2, Desk 2, Sidetable 2, Sofa 2, Coffeetable 2, Drawer 1] L;
    "keychain" / "keychains" in BED_LIVING: [Drawer 2, Sidetable 2, Dresser 2, Coffeetable 2, Shelf 1] L;
    "creditcard" / "creditcards" in BED_LIVING: [Desk 2, Drawer 2, Sidetable 2, Dresser 2, Coffeetable 1] L;
    "watch" / "watches" in BED_LIVING: [Dresser 3, Sidetable 2, Drawer 2, Desk 1, Shelf 1] L;
    "remotecontrol" / "remotecontrols" in LIVING: [Sofa 3, Coffeetable 3, Tvstand 2, Armchair 2, Sidetable 1] L;
    "pillow" / "pillows" in BED_LIVING: [Bed 3, Sofa 3, Armchair 2] 0;
    "vase" / "vases" in BED_LIVING: [Shelf 3, Sidetable 2, Tvstand 2, Coffeetable 2, Dresser 1, Cabinet 1] L;
    "cd" / "cds" in BED_LIVING: [Desk 2, Shelf 2, Drawer 2, Tvstand 1, Sidetable 1] L;
    "alarmclock" / "alarmclocks" in BED: [Sidetable 3, Desk 2, Dresser 2, Shelf 1] L;
    "newspaper" / "newspapers" in LIVING: [Coffeetable 3, Sofa 2, Sidetable 1, Armchair 1] L;
};

/// Whether `object` belongs to `room` and the room can hold it somewhere.
pub(crate) fn found_in(object: &ObjectKind, room: Room) -> bool {
    object.rooms.contains(&room) && object.places.iter().any(|&(k, _)| room.has(k))
}

/// ALFWorld's six task types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskKind {
    /// "put a mug in cabinet 2".
    PickAndPlace,
    /// "examine the book with the desklamp".
    LookAtObjInLight,
    /// "put a clean plate on countertop 1" (clean at the sinkbasin).
    PickCleanThenPlace,
    /// "put a hot apple on diningtable 1" (heat in the microwave).
    PickHeatThenPlace,
    /// "put a cold apple on countertop 1" (cool in the fridge).
    PickCoolThenPlace,
    /// "put two pens in drawer 1".
    PickTwoObjAndPlace,
}

impl TaskKind {
    /// All kinds, in the order task indices cycle through them.
    pub const ALL: [TaskKind; 6] = [
        TaskKind::PickAndPlace,
        TaskKind::LookAtObjInLight,
        TaskKind::PickCleanThenPlace,
        TaskKind::PickHeatThenPlace,
        TaskKind::PickCoolThenPlace,
        TaskKind::PickTwoObjAndPlace,
    ];

    /// The kind's name in configs and [`cairn_plugin_sdk::TaskInfo::kind`].
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::PickAndPlace => "pick_and_place",
            TaskKind::LookAtObjInLight => "look_at_obj_in_light",
            TaskKind::PickCleanThenPlace => "pick_clean_then_place",
            TaskKind::PickHeatThenPlace => "pick_heat_then_place",
            TaskKind::PickCoolThenPlace => "pick_cool_then_place",
            TaskKind::PickTwoObjAndPlace => "pick_two_obj_and_place",
        }
    }

    pub fn from_name(name: &str) -> Option<TaskKind> {
        TaskKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Rooms a task of this kind may be set in.
    pub(crate) fn rooms(self) -> &'static [Room] {
        match self {
            TaskKind::PickAndPlace | TaskKind::PickTwoObjAndPlace => {
                &[Room::Kitchen, Room::Bedroom, Room::Living]
            }
            TaskKind::LookAtObjInLight => &[Room::Bedroom, Room::Living],
            _ => &[Room::Kitchen],
        }
    }

    /// The [`can`] flag the target object kind needs (0: any portable object).
    pub(crate) fn requires(self) -> u8 {
        match self {
            TaskKind::PickCleanThenPlace => can::CLEAN,
            TaskKind::PickHeatThenPlace => can::HEAT,
            TaskKind::PickCoolThenPlace => can::COOL,
            TaskKind::LookAtObjInLight => can::LIGHT,
            TaskKind::PickAndPlace | TaskKind::PickTwoObjAndPlace => 0,
        }
    }

    /// The appliance that changes the target's state, if the task needs one.
    pub(crate) fn appliance(self) -> Option<RecKind> {
        match self {
            TaskKind::PickCleanThenPlace => Some(RecKind::Sinkbasin),
            TaskKind::PickHeatThenPlace => Some(RecKind::Microwave),
            TaskKind::PickCoolThenPlace => Some(RecKind::Fridge),
            _ => None,
        }
    }

    /// How many target objects must end up in the destination.
    pub(crate) fn needed(self) -> usize {
        if self == TaskKind::PickTwoObjAndPlace {
            2
        } else {
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_object_kind_is_found_somewhere_and_every_task_kind_has_targets() {
        for object in OBJECTS {
            assert!(
                [Room::Kitchen, Room::Bedroom, Room::Living]
                    .iter()
                    .any(|&r| found_in(object, r)),
                "{} has no room",
                object.name
            );
        }
        for kind in TaskKind::ALL {
            for &room in kind.rooms() {
                let targets = OBJECTS
                    .iter()
                    .filter(|o| o.can & kind.requires() == kind.requires() && found_in(o, room))
                    .count();
                assert!(
                    targets >= 3,
                    "{} in {} has {targets} target kinds",
                    kind.name(),
                    room.name()
                );
            }
        }
    }

    /// The generator picks a destination kind and then a source kind other than the (single)
    /// destination instance; both choices must exist for every target in every room.
    #[test]
    fn every_target_has_a_destination_and_a_separate_source() {
        for kind in TaskKind::ALL {
            for &room in kind.rooms() {
                for o in OBJECTS
                    .iter()
                    .filter(|o| o.can & kind.requires() == kind.requires())
                {
                    if !found_in(o, room) {
                        continue;
                    }
                    let places: Vec<RecKind> = o
                        .places
                        .iter()
                        .map(|&(k, _)| k)
                        .filter(|&k| room.has(k))
                        .collect();
                    if kind == TaskKind::LookAtObjInLight {
                        assert!(!places.is_empty());
                        continue;
                    }
                    let dests: Vec<RecKind> = places
                        .iter()
                        .copied()
                        .filter(|&k| Some(k) != kind.appliance())
                        .collect();
                    assert!(
                        !dests.is_empty(),
                        "{} {}: no destination",
                        kind.name(),
                        o.name
                    );
                    for dest in dests {
                        let max = room.pool().iter().find(|&&(k, _)| k == dest).unwrap().1;
                        assert!(
                            places.iter().any(|&k| k != dest || max >= 2),
                            "{} {} to {}: no source",
                            kind.name(),
                            o.name,
                            dest.name()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn task_kind_names_round_trip() {
        for kind in TaskKind::ALL {
            assert_eq!(TaskKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(TaskKind::from_name("pick"), None);
    }
}
